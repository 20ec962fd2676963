"""``trainmath serve``: a local web calculator over the same core as the CLI and the report.

- ``app``: requests → responses (the form's fields become the CLI's flags, parsed by the same argparse
  definitions), and the standard library's ``ThreadingHTTPServer`` around it;
- ``page``: the one HTML page with its small script.

Nothing is kept between requests; only catalog models or a dropped config.json are read (never a server path or
the Hub); request bodies are bounded.
"""
