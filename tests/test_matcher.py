"""Matcher: the same (line, signature) hits from hyperscan, RE2 and re; fallbacks that say why."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixtop.diagnosis.catalog import Signature, load_catalog
from radixtop.diagnosis.matcher import ENGINES, Matcher, MatcherError, backtracking_risk, required_literals


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", str(tmp_path_factory.mktemp("hs-cache")))


def sig(sig_id: str, pattern: str, severity: str = "error") -> Signature:
    return Signature(sig_id, sig_id, pattern, severity, "test", "meaning", (), ())


def engine_or_skip(signatures, engine: str) -> Matcher:
    try:
        return Matcher(signatures, engine=engine)
    except MatcherError as exc:
        if "unavailable" in str(exc):
            pytest.skip(str(exc))
        raise


def reference_hits(data: bytes, signatures) -> list[tuple[int, int]]:
    """(line end, index) from Python re run on each line alone: what grep -n means by a hit."""
    compiled = [re.compile(s.pattern.encode()) for s in signatures]
    out = []
    start = 0
    while start <= len(data):
        end = data.find(b"\n", start)
        if end < 0:
            end = len(data)
            if start == end:
                break
        line = data[start:end]
        out.extend((end, i) for i, p in enumerate(compiled) if p.search(line))
        start = end + 1
    return out


SIGS = [
    sig("oom", r"out of memory"),
    sig("anchored", r"^bar$"),
    sig("spaces", r"lock\s+page"),  # \s could cross a newline: must not
    sig("negated", r"node [^;]+;"),  # [^;] could too
    sig("alt", r"(?:Rust TreeCore panicked|mutex poisoned)"),
    sig("digits", r"lock_ref=-?\d+"),
]
TEXT = (
    b"prefill out of memory, out of memory again\n"  # two matches, one hit
    b"bar\n"
    b"foo bar\n"
    b"lock\n"
    b"page\n"  # "lock\npage" must not count
    b"lock   page\n"
    b"node 7\n"
    b"continues;\n"  # "node 7\ncontinues;" must not count
    b"node 8;\n"
    b"Rust TreeCore panicked: oops lock_ref=-1\n"
    b"OUT OF MEMORY\n"  # case-sensitive
    b"bar"  # last line without newline
)


@pytest.mark.parametrize("engine", ENGINES)
def test_scan_reports_each_matching_line_once_at_its_line_end(engine):
    m = engine_or_skip(SIGS, engine)
    assert m.engine == engine
    hits = m.scan(TEXT)
    assert hits == reference_hits(TEXT, SIGS)
    assert hits == sorted(hits)
    for line_end, _ in hits:
        assert line_end == len(TEXT) or TEXT[line_end : line_end + 1] == b"\n"
    lines = {TEXT[TEXT.rfind(b"\n", 0, e) + 1 : e] for e, _ in hits}
    assert lines == {
        b"prefill out of memory, out of memory again",
        b"bar",
        b"lock   page",
        b"node 8;",
        b"Rust TreeCore panicked: oops lock_ref=-1",
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_scan_end_limits_the_buffer_without_copying(engine):
    m = engine_or_skip(SIGS, engine)
    buf = bytearray(TEXT)
    cut = TEXT.index(b"lock\n")  # after "foo bar\n"
    assert m.scan(buf, cut) == reference_hits(TEXT[:cut], SIGS)
    assert m.scan(buf, 0) == []


@pytest.mark.parametrize("engine", ENGINES)
def test_match_one_line(engine):
    m = engine_or_skip(SIGS, engine)
    assert m.match("Rust TreeCore panicked lock_ref=3 out of memory") == (0, 4, 5)
    assert m.match("bar") == (1,)
    assert m.match("nothing here") == ()
    assert m.match("OUT OF MEMORY") == ()
    assert m.match("lock\npage") == ()  # within one line only, as in scan
    assert m.match("caf\u00e9 \udcff out of memory") == (0,)  # odd text does not raise


@pytest.mark.parametrize("engine", ENGINES)
def test_catalog_patterns_agree_with_per_line_re(engine):
    catalog = load_catalog()
    m = engine_or_skip(catalog.signatures, engine)
    text = (
        b"[2026-12-02 14:00:01 TP3] RadixCacheError: Failed to lock memory page during dynamic prefix eviction\n"
        b"[2026-12-02 14:00:01 TP0] Decode batch, #running-req: 3, #token: 640, token usage: 0.04, \n"
        b"  File \"scheduler.py\", line 1\n"
        b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
        b"x EngineDeadError\n"
        b"EngineDeadError at line start\n"
        b"FooEngineDeadError is not one\n"
        b"[2026-12-02 14:00:02 TP1] KV cache pool is full. Retract requests. #retracted_reqs: 1\n"
    )
    assert m.scan(text) == reference_hits(text, catalog.signatures)
    assert len(m.scan(text)) >= 5


# Fragments that make near-misses likely: pieces of patterns, newlines, spaces, odd bytes.
_FRAGMENTS = st.sampled_from(
    ["out of ", "memory", "bar", "\n", " ", "lock", "\t", "page", "node ", "7", ";", "Rust TreeCore ",
     "panicked", "mutex poisoned", "lock_ref=", "-", "\r", "\xe9", "\x00"]
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=40))
def test_engines_equal_the_per_line_reference_on_random_text(parts):
    data = "".join(parts).encode("utf-8")
    expected = reference_hits(data, SIGS)
    for engine in ENGINES:
        try:
            m = Matcher(SIGS, engine=engine)
        except MatcherError:
            continue  # an engine not installed here
        assert m.scan(data) == expected, engine


def test_best_engine_is_hyperscan_when_installed():
    pytest.importorskip("hyperscan")
    m = Matcher(SIGS)
    assert m.engine == "hyperscan"
    assert m.fallback_note is None


def test_missing_hyperscan_falls_back_to_re2_and_says_why(monkeypatch):
    pytest.importorskip("re2")
    monkeypatch.setitem(sys.modules, "hyperscan", None)  # makes `import hyperscan` fail
    m = Matcher(SIGS)
    assert m.engine == "re2"
    assert m.fallback_note.startswith("hyperscan unavailable: ")
    assert m.fallback_note.endswith("; using re2")
    assert m.scan(TEXT) == reference_hits(TEXT, SIGS)


def test_no_optional_engine_falls_back_to_re(monkeypatch):
    monkeypatch.setitem(sys.modules, "hyperscan", None)
    monkeypatch.setitem(sys.modules, "re2", None)
    m = Matcher(SIGS)
    assert m.engine == "re"
    assert "hyperscan unavailable" in m.fallback_note and "re2 unavailable" in m.fallback_note
    with pytest.raises(MatcherError, match="hyperscan unavailable"):
        Matcher(SIGS, engine="hyperscan")


def test_a_pattern_hyperscan_rejects_moves_the_whole_matcher_and_names_the_signature():
    pytest.importorskip("hyperscan")
    pytest.importorskip("re2")
    sigs = [*SIGS, sig("empty-ok", r"x*")]  # hyperscan refuses patterns matching the empty string
    m = Matcher(sigs)
    assert m.engine == "re2"
    assert "hyperscan cannot compile signature 'empty-ok'" in m.fallback_note
    with pytest.raises(MatcherError, match="empty-ok"):
        Matcher(sigs, engine="hyperscan")


def test_a_pattern_only_re_understands_runs_alone_on_re_and_the_rest_stay_on_re2():
    pytest.importorskip("re2")
    sigs = [sig("backref", r"(ab)\1"), sig("nested", r"(\w+\s?)+QZX")]
    m = Matcher(sigs)
    assert m.engine == "re2"
    note = m.fallback_note
    assert "re2 cannot compile signature 'backref'" in note and "it runs on re" in note
    assert note.endswith("; using re2")
    if "hyperscan" in sys.modules and sys.modules["hyperscan"] is not None:
        assert "hyperscan cannot compile signature 'backref'" in note
    assert m.scan(b"xabab\nab\nxy QZX\n") == [(5, 0), (15, 1)]


def _ends_in(code: str, limit_s: float) -> subprocess.CompletedProcess[str]:
    """`code` in a child Python, killed after limit_s: a hang is a failure, not a stuck suite."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=limit_s)


NESTED_LINE = "QZX! " + "a" * 40 + "!"  # `re` tries 2**40 splits of the a's for (\w+\s?)+QZX


def test_a_nested_repeat_stays_off_re_when_another_pattern_needs_re():
    # A counted repeat over 1,000 is refused by hyperscan and RE2; before, it moved the whole
    # catalog to `re`, where the nested repeat below ran for hours on one line.
    code = (
        "from radixtop.diagnosis.catalog import Signature\n"
        "from radixtop.diagnosis.matcher import Matcher\n"
        "s = lambda i, p: Signature(i, i, p, 'error', 't', 'm', (), ())\n"
        "m = Matcher([s('big', 'Zq{1,60000}Y'), s('nested', r'(\\w+\\s?)+QZX')])\n"
        f"line = {NESTED_LINE!r}\n"
        "print(m.engine, m.scan((line + '\\n').encode()), m.match(line), m.match('ZqqY'))\n"
    )
    done = _ends_in(code, 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["re2", "[]", "()", "(0,)"]


def test_hyperscan_rechecks_a_nested_repeat_without_re():
    pytest.importorskip("hyperscan")
    # \s may cross lines, so hyperscan's hits are re-checked on their line: not with `re` here.
    code = (
        "from radixtop.diagnosis.catalog import Signature\n"
        "from radixtop.diagnosis.matcher import Matcher\n"
        "m = Matcher([Signature('n', 'n', r'(\\w+\\s?)+QZX', 'error', 't', 'm', (), ())])\n"
        f"line = {('a' * 40 + '! b QZX')!r}\n"
        "print(m.engine, m.scan((line + '\\n').encode()), m.match(line))\n"
    )
    done = _ends_in(code, 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hyperscan", "[(47,", "0)]", "(0,)"]


def test_the_span_of_a_hit_is_found_without_re_on_a_nested_repeat():
    # The log pane marks where a signature matched; `re` took 2**40 tries to find this one.
    code = (
        "from radixtop.diagnosis.matcher import span_search\n"
        "print(span_search(r'(\\w+\\s?)+QZX')('a' * 40 + '! b QZX'), span_search(r'lock\\s+page')('a lock  page'),"
        " span_search('(unclosed'))\n"
    )
    done = _ends_in(code, 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(42,", "47)", "(2,", "12)", "None"]


def test_re_alone_refuses_a_nested_repeat_in_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "hyperscan", None)
    monkeypatch.setitem(sys.modules, "re2", None)
    with pytest.raises(MatcherError) as caught:
        Matcher([sig("ok", r"out of memory"), sig("nested", r"Prefill batch(.*)*QZX")])
    message = str(caught.value)
    assert "'nested'" in message and '"Prefill batch(.*)*QZX" has a repeat inside a repeat' in message
    assert "install google-re2" in message and "\n" not in message


@pytest.mark.parametrize(
    ("pattern", "risky"),
    [(r"(\w+\s?)+QZX", True), (r"(.*)*x", True), (r"((a)+b)+", True), (r"(\w+){1,60000}", True),
     (r"a{1,60000}", False), (r"(?:foo|bar)+", False), (r"x(?:\s+\w+)?y", False), (r"(a+){2}", False),
     (r"a\)+b+", False)],
)
def test_backtracking_risk_is_a_repeat_of_many_rounds_inside_another(pattern, risky):
    assert (backtracking_risk(pattern) is not None) == risky


def test_the_builtin_catalog_has_no_pattern_re_could_run_without_end():
    assert [s.id for s in load_catalog().signatures if backtracking_risk(s.pattern)] == []


def test_bad_pattern_for_every_engine_is_an_error_naming_it():
    with pytest.raises(MatcherError, match="'broken'"):
        Matcher([sig("broken", r"(unclosed")])


def test_unknown_engine_and_no_signatures():
    with pytest.raises(MatcherError, match="unknown engine"):
        Matcher(SIGS, engine="pcre")
    empty = Matcher([])
    assert empty.match("anything") == () and empty.scan(b"anything\n") == []


def test_compiled_hyperscan_database_is_cached_and_a_damaged_cache_is_replaced(tmp_path, monkeypatch):
    pytest.importorskip("hyperscan")
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", str(tmp_path))
    first = Matcher(SIGS, engine="hyperscan")
    files = list(tmp_path.glob("hs-*.db"))
    assert len(files) == 1 and files[0].stat().st_size > 0
    assert Matcher(SIGS, engine="hyperscan").scan(TEXT) == first.scan(TEXT)  # loaded from the file
    files[0].write_bytes(b"not a database")
    assert Matcher(SIGS, engine="hyperscan").scan(TEXT) == reference_hits(TEXT, SIGS)
    assert files[0].read_bytes() != b"not a database"
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", "")  # off: nothing written anywhere
    other = [sig("other", "something else")]
    Matcher(other, engine="hyperscan")
    assert len(list(tmp_path.glob("hs-*.db"))) == 1


def test_a_cached_database_for_other_patterns_is_never_used(tmp_path, monkeypatch):
    # A cache file's name is only a hint: one holding another pattern set (a name collision, or a
    # file copied over) must be rebuilt, not loaded.
    pytest.importorskip("hyperscan")
    monkeypatch.setenv("RADIXTOP_CACHE_DIR", str(tmp_path))
    other = [sig("other", r"something else")]
    Matcher(other, engine="hyperscan")
    [other_file] = tmp_path.glob("hs-*.db")
    other_db = other_file.read_bytes()
    Matcher(SIGS, engine="hyperscan")
    [mine] = [f for f in tmp_path.glob("hs-*.db") if f != other_file]
    mine.write_bytes(other_db)
    assert Matcher(SIGS, engine="hyperscan").scan(TEXT) == reference_hits(TEXT, SIGS)
    assert mine.read_bytes() != other_db


def test_hyperscan_compiles_no_python_regex_until_a_hit_needs_a_recheck(monkeypatch):
    pytest.importorskip("hyperscan")
    Matcher(SIGS, engine="hyperscan")  # the database is cached from here on
    expected = reference_hits(TEXT, SIGS)
    compiled: list[bytes] = []
    real = re.compile

    def spy(pattern, flags=0):
        if isinstance(pattern, bytes):
            compiled.append(pattern)
        return real(pattern, flags)

    monkeypatch.setattr(re, "compile", spy)
    matcher = Matcher(SIGS, engine="hyperscan")
    assert matcher.scan(b"prefill out of memory\nbar\n") == [(21, 0), (25, 1)]
    assert compiled == []  # neither pattern can cross a line: nothing to re-check
    assert matcher.scan(TEXT) == expected
    assert sorted(compiled) == sorted(b"(?m)" + SIGS[i].pattern.encode() for i in (2, 3))
    matcher.scan(TEXT)
    assert len(compiled) == 2  # compiled once each


def test_required_literals_for_the_re_prefilter():
    assert required_literals(r"Scheduler hit an exception") == (b"Scheduler hit an exception",)
    assert required_literals(r"(?:CUDA|HIP) error: an illegal memory access") == (
        b" error: an illegal memory access",
    )
    # Python's parser may factor out the shared "nccl": any required set will do, if every match
    # holds one of its literals.
    literals = required_literals(r"ncclSystemError|ncclInternalError")
    for text in (b"ncclSystemError", b"ncclInternalError"):
        assert any(x in text for x in literals)
    assert min(len(x) for x in literals) >= 3
    assert required_literals(r"No available block found in \d+ seconds?") == (b"No available block found in ",)
    assert required_literals(r"(?i)case blind") is None  # a case-blind literal would miss lines
    assert required_literals(r"\d+ab") is None  # too short to help
    assert required_literals(r"(?:foo)?bar+") is None


@pytest.mark.parametrize("engine", ENGINES)
def test_line_hits_name_each_line_a_signature_matches_by_its_index(engine):
    m = engine_or_skip(SIGS, engine)
    texts = TEXT.decode().split("\n")
    hits = m.line_hits(texts)
    assert hits == sorted(hits)
    by_reference = {(TEXT.count(b"\n", 0, end), index) for end, index in reference_hits(TEXT, SIGS)}
    assert set(hits) == by_reference and len(hits) == len(by_reference)
    assert {texts[line] for line, _ in hits} >= {"lock   page", "node 8;"}


def test_literals_match_as_plain_strings_even_with_regex_characters() -> None:
    literals = ("] r=", "(x)", "a.b", "#tokens: ")
    m = Matcher.of_literals(literals)
    texts = ["[3] r=1", "axb", "a.b", "f(x)", "#tokens: 44", "no", "] r"]
    assert m.line_hits(texts) == [(0, 0), (2, 2), (3, 1), (4, 3)]
    assert m.line_hits([]) == [] and m.line_hits(["quiet"] * 1000) == []
