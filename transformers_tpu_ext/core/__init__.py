"""What every capability shares, below them all (the package's top holds the rest of the core).

- ``wrapping``: how a patch wraps (``Wraps``: apply/revert, ``fail_safe``, ``user_error``, ``warn_once``);
- ``_post_import``: the post-import hooks patches are armed with;
- ``versions``: supported ranges and tested releases (from requirements.txt), the version gate;
- ``progress``: progress bars and per-step info lines for long work (warmup, doctor);
- ``topology``: chip generations and the process counts each has a topology for;
- ``length_readers``: what reads the length of a forward pass: padding and chunking predicates (pure).
"""
