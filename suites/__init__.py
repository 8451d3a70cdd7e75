"""The conformance suites. In a clone they are this folder (``pytest suites/``); installed,
the package ``conformance.suites`` (``pytest --pyargs conformance.suites``): setup.py maps the
one onto the other, and :func:`conformance.suites_location.suites_folder` finds them."""
