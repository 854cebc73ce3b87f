"""The results pages (docs/results.md, the index, and docs/results/*.md, one page per study): every generated table
matches what its results folder gives today (scripts/results_md.py --write rewrites them), and every relative link
of README.md and docs/ reaches a file and, with an anchor, one of that file's headings (GitHub's rules)."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("results_md", ROOT / "scripts" / "results_md.py")
results_md = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results_md)

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, inline code spans removed."""
    lines, in_code = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (link targets and HTML dropped), lowercase, punctuation dropped,
    spaces → '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in a markdown file, repeated headings numbered as GitHub numbers them (-1, -2, …)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m[2])
        count = seen.get(base, 0)
        out.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of one markdown file that reach no file, or no heading of the file they name."""
    broken = []
    prose = "\n".join(re.sub(r"`[^`]*`", "", line) for line in prose_lines(page.read_text()))
    for target in LINK.findall(prose):  # a link's text may wrap onto the next line
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


def test_slug_follows_githubs_rules():
    assert slug("SQuAD, mid-depth window (5–9)") == "squad-mid-depth-window-59"
    assert slug("SmolLM2-135M → Gemma-3-270m, terminal window 13–17 (`smollm2-to-gemma3`, `-linear`)") == \
        "smollm2-135m--gemma-3-270m-terminal-window-1317-smollm2-to-gemma3--linear"
    assert slug("Several readers, one hub: 4 and 2 shards") == "several-readers-one-hub-4-and-2-shards"


def test_every_relative_link_in_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = {str(p.relative_to(ROOT)): b for p in pages if (b := broken_links(p))}
    assert not broken, f"links that reach no file or heading: {broken}"


def test_a_broken_anchor_is_caught(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Known limits\n\n```bash\n# a comment, not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#known-limits), [self](#b) [gone](a.md#a-comment-not-a-heading) [no\nfile](c.md)\n\n"
                    "`[code](d.md)`\n\n# B\n")
    assert [b.split(" ")[0] for b in broken_links(page)] == ["a.md#a-comment-not-a-heading", "c.md"]


def test_the_results_pages_hold_their_folders_current_tables():
    pages = results_md.results_pages()
    assert len(pages) > 1 and pages[0] == ROOT / "docs" / "results.md"
    markers = [m["source"] for p in pages for m in results_md.GENERATED.finditer(p.read_text())]
    assert any(s.startswith("results/eval/") for s in markers) and any(s.startswith("results/long/") for s in markers)
    stale = {str(p.relative_to(ROOT)): s for p in pages if (s := results_md.stale_tables(p.read_text()))}
    assert not stale, f"generated tables older than their folders (run scripts/results_md.py --write): {stale}"


def test_a_changed_folder_makes_its_table_stale_and_write_touches_only_the_markers(tmp_path):
    source = "results/long/smollm2-to-gemma3-stacks"
    shutil.copytree(ROOT / source, tmp_path / source)
    page = f"prose 0.5 above\n\n<!-- generated: {source} -->\nold table\n<!-- end generated -->\n\nprose below\n"
    current = results_md.regenerate(page, tmp_path)
    assert current.startswith("prose 0.5 above\n\n") and current.endswith("<!-- end generated -->\n\nprose below\n")
    assert "| 512 | 12 | 0.225 |" in current and results_md.stale_tables(current, tmp_path) == []

    summary = pd.read_csv(tmp_path / source / "summary.csv")
    summary.loc[(summary["condition"] == "native") & (summary["budget"] == 512), "mean"] = 0.5
    summary.to_csv(tmp_path / source / "summary.csv", index=False)
    assert results_md.stale_tables(current, tmp_path) == [source]
    assert "| 512 | 12 | 0.500 |" in results_md.regenerate(current, tmp_path)


def test_a_marker_naming_no_results_folder_says_so():
    with pytest.raises(SystemExit, match="no such results folder"):
        results_md.regenerate("<!-- generated: results/eval/no-such-run -->\n<!-- end generated -->\n")
