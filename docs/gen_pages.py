"""Run by mkdocs (the gen-files plugin) at every build: the pages made from the code
(incast/pages/reference.py). Nothing it writes is kept in docs/."""
import mkdocs_gen_files

from incast.cli import flags
from incast.pages import reference

for path, text in reference.pages(flags()).items():
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(text)
