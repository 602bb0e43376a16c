"""The fixtures of the support modules that need an extra: tests/conftest.py loads each plugin here
whose extras are installed, so that tests/core/ runs with the base install alone.

Fixtures are found by name and never imported: no module, test or benchmark, imports a plugin
(tests/packaging/test_layout.py checks it). What a fixture does is a plain function or context
manager of a support module, which a benchmark calls as the fixture does."""
