"""Skip the optional Lightning integration when Lightning is not installed (``pip install pyro-bbb[lightning]``)."""

import importlib.util

collect_ignore = []
if importlib.util.find_spec("lightning") is None:
    collect_ignore += ["pyro_bbb/lightning.py", "tests/lightning_script.py", "tests/test_lightning.py"]
