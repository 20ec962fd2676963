"""Pictures of the calculator's results.

- ``palette``: one colour per component, shared by every chart;
- ``charts`` and ``fromjson``: what each chart shows, gathered from results (pure: no matplotlib);
- ``mpl``: matplotlib figures for ``trainmath plot`` (the only module here that imports matplotlib);
- ``svg``: the same charts as inline SVG for the report and the web page (standard library only);
- ``output``: writing files whole (temporary file, then rename).
"""
