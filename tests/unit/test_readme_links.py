"""Every relative link of README.md (and of the repository's other top-level Markdown files) reaches
a file of the repository, and every #anchor a heading of that file, by GitHub's rule for heading
anchors (the documentation site's links are checked by `mkdocs build --strict`, tests/run's docs step)."""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", ROOT / "slurm" / "README.md", *(ROOT / "tests").glob("README.md")]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but - and _, spaces as -."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#+ +(.+)$", text, flags=re.M)}


def links(path: pathlib.Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("source", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(source):
    missing = []
    for target in links(source):
        file, _, anchor = target.partition("#")
        path = (source.parent / file).resolve() if file else source
        if not path.exists():
            missing.append(f"{target}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            missing.append(f"{target}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not missing, f"{source.relative_to(ROOT)}: " + "; ".join(missing)


def test_the_anchor_rule():
    assert github_anchor("Keras 2 (tf_keras)") == "keras-2-tf_keras"
    assert github_anchor("Horovod programs: `import mpidist.horovod.tensorflow as hvd`") == \
        "horovod-programs-import-mpidisthorovodtensorflow-as-hvd"
