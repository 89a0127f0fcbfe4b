"""The one escaping of text that goes into a markdown report (matrix, upgrade, dead ends, diff, watch).

Record and rule text (a probe's evidence, a reason, a reading's code line, a source) is data, never markup:
a PR comment renders raw HTML and links, so ``<script>``, ``<img onerror=...>`` or ``[x](javascript:...)``
in a record would run in a reader's page. The HTML reports escape with :func:`html.escape`; every markdown
writer passes its text through :func:`md_text`, which does the same for markdown:

* ``&``, ``<`` and ``>`` become entities (``&amp;`` ``&lt;`` ``&gt;``): no tag, comment or entity survives;
* a link whose target is ``javascript:``, ``vbscript:`` or ``data:`` becomes plain text
  (``x (javascript&#58;...)``), and such a scheme anywhere in the text loses its colon to ``&#58;``, with
  ``](`` and ``]:`` escaped so that no link or reference definition can form around it;
* a code span stays a code span when its content is inert; markdown shows a code span's characters
  literally (an entity would read ``&lt;``), so a span holding ``<``, ``>``, ``&`` or such a scheme is
  written as escaped text instead, its markdown punctuation backslash-escaped: it reads the same, unstyled.

The text should be passed once (escaping is not idempotent: ``&lt;`` would read ``&amp;lt;``).
"""

from __future__ import annotations

import re

__all__ = ["md_document", "md_text"]

_SCHEMES = r"javascript|vbscript|data"
# A scheme name not glued to a longer word ("metadata:" is no data: URL).
_DANGEROUS = re.compile(rf"(?<![A-Za-z0-9+.\-])({_SCHEMES})(\s*):", re.IGNORECASE)
# [text](target) whose target starts with a dangerous scheme (optionally in <...>, after spaces).
_DANGEROUS_LINK = re.compile(rf"\[([^\]]*)\]\(\s*<?\s*((?:{_SCHEMES})\s*:[^)]*)\)", re.IGNORECASE)
# Single-backtick code spans, as the writers make them.
_CODE_SPAN = re.compile(r"`([^`\n]*)`")
# Markdown punctuation that styles plain text (links are _plain's: only dangerous ones are undone).
_MARKUP = re.compile(r"([\\*_~`#])")   # pipes are the table writers' (\|)


def md_text(text: object) -> str:
    """``text`` made inert for markdown (see the module docstring); code spans kept where inert."""
    out: list[str] = []
    last = 0
    raw = str(text)
    for span in _CODE_SPAN.finditer(raw):
        out.append(_plain(raw[last:span.start()]))
        content = span.group(1)
        out.append(span.group(0) if _inert_in_code(content) else _plain(_MARKUP.sub(r"\\\1", content)))
        last = span.end()
    out.append(_plain(raw[last:]))
    return "".join(out)


def _inert_in_code(content: str) -> bool:
    return not any(c in content for c in "<>&") and not _DANGEROUS.search(content)


def _plain(text: str) -> str:
    if not text:
        return text
    dangerous = bool(_DANGEROUS.search(text))
    if dangerous:
        text = _DANGEROUS_LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if dangerous:
        # No link or reference definition can form around what is left (an entity in a link target is
        # decoded, so the colon alone is not enough): `](` and `]:` lose their meaning.
        text = text.replace("](", "]\\(").replace("]:", "]\\:")
        text = _DANGEROUS.sub(lambda m: f"{m.group(1)}{m.group(2)}&#58;", text)
    return text


def md_document(text: str, *, tags: tuple[str, ...] = ("details", "summary")) -> str:
    """A whole markdown document whose lines mix the writer's markup with record text: each line through
    :func:`md_text`, but for the writer's own ``tags`` (folding). A plain fenced code block (```` ``` ````,
    the writer's) becomes a ``<pre>`` block with its lines escaped: markdown shows a fence's content
    literally, so an entity there would read ``&lt;``, while ``<pre>`` shows it as written and no tag in
    it is live. A fence with a language (```` ```diff ````: the writer's own patch) stays a fence.

    A line is passed through unescaped only inside a fence that markdown itself sees as one (CommonMark's
    rules): opened at the line's start (```` ``` ```` + a language without a backtick, or ``~~~``), not inside
    an HTML block that a kept tag at a line's start opened (it lasts to a blank line), and closed only by a
    fence of the same character, at least as long, with nothing after it. Record text that only looks like a
    fence (```` ```a`b ````, a fence indented under a list item) never makes the lines after it raw."""
    keep = re.compile(r"(</?(?:" + "|".join(map(re.escape, tags)) + r")>)")
    opens_html_block = re.compile(r" {0,3}</?(?:" + "|".join(map(re.escape, tags)) + r")(?:[ \t>]|/>|$)")
    lines: list[str] = []
    fence: tuple[str, str, int] | None = None   # ("pre", "", 0): a plain fence made <pre>; (kind, char, length)
    html_block = False
    for line in text.split("\n"):
        if fence is not None and fence[0] == "pre":
            if line.startswith("```"):
                lines.append("</pre>")
                fence = None
            else:
                lines.append(_in_pre(line))
            continue
        if fence is not None:
            kind, char, length = fence
            lines.append(line if kind == "raw" else md_text(line))
            if re.fullmatch(rf" {{0,3}}{re.escape(char)}{{{length},}}[ \t]*", line):
                fence = None
            continue
        opener = None if html_block else _FENCE.fullmatch(line)
        if opener is not None and not (opener.group(2).startswith("`") and "`" in opener.group(3)):
            run = opener.group(2)
            if line == "```":
                lines.append("<pre>")
                fence = ("pre", "", 0)
            else:
                # At a line's start a fence is markdown's at the top level: its content is shown literally. One
                # indented (a list item's, which markdown may end early) keeps its content escaped.
                raw = not opener.group(1)
                lines.append(line if raw else md_text(line))
                fence = ("raw" if raw else "escaped", run[0], len(run))
            continue
        parts = keep.split(line)
        made = "".join(part if keep.fullmatch(part) else md_text(part) for part in parts)
        lines.append(made)
        if not line.strip():
            html_block = False
        elif opens_html_block.match(made):
            html_block = True
    return "\n".join(lines)


# A fence's opening line, as CommonMark reads it: up to 3 spaces, 3 or more backticks or tildes, an info string.
_FENCE = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)")


def _in_pre(line: str) -> str:
    """A line of a ``<pre>`` block: HTML-escaped (entities are decoded there, so it reads as written), and a
    dangerous scheme's colon and a ``](`` before it as entities too, so no reader takes it for a link."""
    text = line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if _DANGEROUS.search(text):
        text = _DANGEROUS.sub(lambda m: f"{m.group(1)}{m.group(2)}&#58;", text.replace("](", "]&#40;"))
    return text
