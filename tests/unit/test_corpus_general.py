"""The offline corpus's `general` domain (HDEE's general-text seed): prose, disjoint from every other domain."""

from decentrain.data.corpus import DOMAINS, load_domain


def test_general_text_shares_no_document_with_the_expert_domains():
    general = set(load_domain("general", 60_000, 0))
    assert general and sum(map(len, general)) >= 60_000 * 0.5
    for other in ("licenses", "changelogs", "python_docs", "c_headers"):
        assert not general & set(load_domain(other, 60_000, 0)), other
    assert "general" in DOMAINS.names()
