"""The machine's issue-rate facts: measured by an FMA micro-benchmark, cached, overridable."""

from __future__ import annotations

import json

import pytest

from alt_tvm import facts as mf
from alt_tvm.target import HardwareTarget, host


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.delenv(mf.FACTS_ENV, raising=False)
    return tmp_path / "machine-facts.json"


def _cached(cache, key: str, lanes_per_ns: dict[int, float], chains: dict[int, int]) -> None:
    record = mf.IssueFacts(lanes_per_ns=lanes_per_ns, chains=chains).to_json()
    cache.write_text(json.dumps({"schema_version": mf.SCHEMA_VERSION, "machines": {key: record}}))


@pytest.mark.parametrize("half, full, expected", [(40.0, 80.0, False), (48.0, 80.0, False), (76.0, 80.0, True)])
def test_half_vectors_issue_at_the_full_rate_only_when_their_lanes_keep_up(half, full, expected):
    facts = mf.IssueFacts(lanes_per_ns={256: half, 512: full}, chains={512: 8})
    assert facts.half_vectors_full_rate(512) is expected
    assert facts.half_vectors_full_rate(256) is False  # 128-bit was not measured
    assert facts.fma_chains(512) == 8 and facts.fma_chains(256) == mf.DECLARED_FMA_CHAINS


def test_cached_facts_are_read_without_measuring(cache, monkeypatch):
    key = f"{mf.machine_signature()}:somecpu:512"
    _cached(cache, key, {256: 79.0, 512: 80.0}, {512: 6})

    def no_measuring(**_):
        raise AssertionError("measured although the cache had the facts")

    monkeypatch.setattr(mf, "measure_issue_facts", no_measuring)
    assert mf.issue_facts(vector_bits=512, mcpu="somecpu", cache=cache) == (True, 6, "cache")


def test_missing_facts_are_measured_once_and_cached(cache):
    h = host()
    first = mf.issue_facts(vector_bits=h.vector_bits, mcpu=h.tvm_target["mcpu"], cache=cache)
    assert first[2] == "measured" and first[1] in mf.CHAIN_COUNTS
    entry = json.loads(cache.read_text())["machines"]
    (record,) = entry.values()
    rates = {int(k): v for k, v in record["lanes_per_ns"].items()}
    assert set(rates) == {h.vector_bits, h.vector_bits // 2} and all(r > 0 for r in rates.values())
    # A wider vector never multiply-adds fewer lanes per second than half of one (with slack for a
    # neighbour's load): the measurement times FMA issue, not something else.
    assert rates[h.vector_bits] > 0.7 * rates[h.vector_bits // 2]
    assert mf.issue_facts(vector_bits=h.vector_bits, mcpu=h.tvm_target["mcpu"], cache=cache) == (*first[:2], "cache")


def test_an_override_file_replaces_the_measured_facts(cache, tmp_path, monkeypatch):
    _cached(cache, f"{mf.machine_signature()}:somecpu:512", {256: 40.0, 512: 80.0}, {512: 8})
    override = tmp_path / "facts.json"
    override.write_text(json.dumps({"half_vectors_full_rate": True}))
    monkeypatch.setenv(mf.FACTS_ENV, str(override))
    assert mf.issue_facts(vector_bits=512, mcpu="somecpu", cache=cache) == (True, 8, str(override))
    override.write_text(json.dumps({"half_vectors_full_rate": False, "fma_chains": 12}))
    assert mf.issue_facts(vector_bits=512, mcpu="othercpu", cache=cache)[:2] == (False, 12)


@pytest.mark.parametrize("content, message", [
    ('{"fma_chains": 0}', "fma_chains must be an int >= 1, got 0"),
    ('{"half_vectors_full_rate": "yes"}', "half_vectors_full_rate must be true or false, got 'yes'"),
    ('{"vector_bits": 512}', "allowed: an object with keys"),
    ("not json", "cannot read a JSON object"),
])
def test_a_bad_override_file_is_named_with_what_is_allowed(cache, tmp_path, monkeypatch, content, message):
    override = tmp_path / "facts.json"
    override.write_text(content)
    monkeypatch.setenv(mf.FACTS_ENV, str(override))
    with pytest.raises(ValueError, match=mf.FACTS_ENV) as err:
        mf.issue_facts(vector_bits=512, mcpu="somecpu", cache=cache)
    assert message in str(err.value)


def test_a_described_target_takes_a_positive_chain_count():
    with pytest.raises(ValueError, match="fma_chains must be an int >= 1, got 0"):
        HardwareTarget(name="x", description="x", tvm_target={"kind": "llvm"}, num_cores=1, vector_bits=128,
                       vector_registers=16, l1d_bytes=0, l2_bytes=0, l3_bytes=0, cache_line_bytes=64, fma_chains=0)


def test_a_broken_cache_file_is_measured_over(cache):
    cache.write_text("{ not json")
    h = host()
    assert mf.issue_facts(vector_bits=h.vector_bits, mcpu=h.tvm_target["mcpu"], cache=cache)[2] == "measured"
    assert json.loads(cache.read_text())["schema_version"] == mf.SCHEMA_VERSION
