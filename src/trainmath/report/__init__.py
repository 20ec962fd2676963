"""A shareable, self-contained HTML report of one model and setup (``trainmath report``), and the data the web
page (``trainmath serve``) shows.

- ``options``: the setup flags shared with ``plot memory`` and ``serve``;
- ``gather``: the calculator's results for a setup (pure);
- ``html``: the page: inline CSS and SVG, no script, no network when viewed; printable.
"""
