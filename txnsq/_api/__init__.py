"""How the public face is kept: deprecation warnings and misspelt names in one wording
(``deprecate``), every old spelling and its one folding rule (``compat``, deleted in the
release the deprecations name), and the fields' comments in ``help()`` (``fielddocs``).
Pure: nothing here imports Twisted."""
