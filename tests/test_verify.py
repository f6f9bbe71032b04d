"""Per-shard checksums: `coli convert` records them in colibri.json, `coli verify` and
`coli doctor --deep` read every shard back and name the shard and the byte range that differs;
a container without checksums is reported as such, not failed."""
import json
import struct

import pytest

from colibri.model import shard_sums
from launcher_helpers import coli, convert_tiny, copy_model, shard_of

import doctor


@pytest.fixture(scope="module")
def good(oracle_root, tmp_path_factory):
    return convert_tiny(oracle_root, tmp_path_factory.mktemp("verify") / "good")


@pytest.fixture
def copy(good, tmp_path):
    return copy_model(good, tmp_path / "m")


def damage(model, length=4096):
    """Overwrites `length` bytes in the middle of the first shard's tensor data with 0xFF."""
    p = shard_of(model)
    raw = bytearray(p.read_bytes())
    (hlen,) = struct.unpack("<Q", raw[:8])
    at = 8 + hlen + (len(raw) - 8 - hlen) // 2
    raw[at:at + length] = b"\xff" * length
    p.write_bytes(bytes(raw))
    return p, at


def test_convert_records_a_checksum_per_shard(good):
    man = json.loads((good / "colibri.json").read_text())
    sums = man[shard_sums.KEY]
    assert sorted(sums) == sorted(man["shards"])
    for name, entry in sums.items():
        assert entry["size"] == (good / name).stat().st_size and entry["chunk_bytes"] == shard_sums.CHUNK
        assert len(entry["sha256"]) == -(-entry["size"] // shard_sums.CHUNK)


def test_verify_passes_a_good_container(good):
    r = coli("verify", "--model", good)
    assert r.returncode == 0 and "match the checksums" in r.stdout, r.stderr


def test_verify_and_doctor_deep_name_the_damaged_shard_and_range(copy):
    p, at = damage(copy)
    r = coli("verify", "--model", copy)
    assert r.returncode == 2 and p.name in r.stderr and "bytes 0-" in r.stderr and "fix:" in r.stderr, r.stderr
    rep = doctor.diagnose(str(copy), deep=True)
    by = {c["name"]: c for c in rep.checks}
    assert rep.worst == "fail" and by["checksums"]["status"] == "fail" and p.name in by["checksums"]["detail"]
    assert by["tensors"]["status"] == "pass"  # the structure is intact: only the checksums see the damage


def test_the_range_names_the_chunk_that_differs(tmp_path):
    f = tmp_path / "model-00001-of-00001.safetensors"
    f.write_bytes(bytes(3 * 4096 + 100))
    man = {"shards": [f.name], shard_sums.KEY: {f.name: shard_sums.chunk_sums(f, chunk=4096)}}
    assert shard_sums.verify(tmp_path, man)[0] == "pass"
    raw = bytearray(f.read_bytes())
    raw[5000:5010] = b"\xff" * 10
    raw[-1] = 1
    f.write_bytes(bytes(raw))
    status, lines = shard_sums.verify(tmp_path, man)
    assert status == "fail" and lines == [f"{f.name}: bytes 4096-8191, bytes 12288-12387 differ from the "
                                          f"checksums recorded at conversion"]
    f.write_bytes(bytes(raw[:-50]))
    status, lines = shard_sums.verify(tmp_path, man)
    assert status == "fail" and "truncated" in lines[0]


def test_a_container_without_checksums_is_reported_not_failed(copy):
    path = copy / "colibri.json"
    man = json.loads(path.read_text())
    del man[shard_sums.KEY]
    path.write_text(json.dumps(man))
    r = coli("verify", "--model", copy)
    assert r.returncode == 0 and "records no shard checksums" in r.stderr and "re-convert" in r.stderr, r.stderr
    by = {c["name"]: c for c in doctor.diagnose(str(copy), deep=True).checks}
    assert by["checksums"]["status"] == "warn" and "no shard checksums" in by["checksums"]["detail"]


def test_verify_without_a_model_says_what_to_do():
    r = coli("verify", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--model" in r.stderr
