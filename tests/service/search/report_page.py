"""Reads a report page back: checks that its tags nest and close, collects attributes and ranking rows."""

from __future__ import annotations

from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "hr", "img", "input", "link", "meta", "source", "wbr"}


class PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, str]] = []
        """Open elements: (tag, id)."""
        self.problems: list[str] = []
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []
        """(tag, attribute, value) of every start tag."""
        self.ranking_rows: list[dict[str, str]] = []
        """Attributes of each row in the ranking table's body."""
        self.row_text: dict[str, str] = {}
        """Text of each ranking row, by candidate id."""
        self._row: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        self.tags.append(tag)
        self.attributes += [(tag, name, value) for name, value in values.items()]
        if tag == "tr" and self._inside("tbody") and self._inside_id("ranking"):
            self.ranking_rows.append(values)
            self._row = values.get("data-id", "")
            self.row_text[self._row] = ""
        if tag not in VOID:
            self.open.append((tag, values.get("id", "")))

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open[-1][0] != tag:
            self.problems.append(f"</{tag}> closes {self.open[-1][0] if self.open else 'nothing'}")
            return
        self.open.pop()
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None:
            self.row_text[self._row] += data

    def _inside(self, tag: str) -> bool:
        return any(t == tag for t, _ in self.open)

    def _inside_id(self, element_id: str) -> bool:
        return any(i == element_id for _, i in self.open)


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    parser.close()
    return parser
