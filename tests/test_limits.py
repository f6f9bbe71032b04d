"""The launcher's copy of the engine's fixed numbers (colibri/limits.py) equals what the engine
reports (`colibri limits`): a change on one side that the other missed fails here."""
import pytest
from engine_binaries import engine_bin  # noqa: F401  (fixture)

from colibri import limits


def test_python_limits_equal_the_engine_report(engine_bin):  # noqa: F811
    assert limits.engine_report(engine_bin) == {
        "max_kv_slots": limits.MAX_KV_SLOTS, "qblock": limits.QBLOCK,
        "q8_block_bytes": limits.BLOCK_BYTES["q8"], "q4_block_bytes": limits.BLOCK_BYTES["q4"],
        "mxfp4_block_bytes": limits.BLOCK_BYTES["mxfp4"], "q6_block_bytes": limits.BLOCK_BYTES["q6"],
        "default_batch": limits.DEFAULT_BATCH, "default_batch_amx": limits.DEFAULT_BATCH_AMX, "runtime_base": limits.RUNTIME_BASE,
        **{f"{name}_block_{k}": v for name, (elems, size) in limits.LOWBIT_BLOCKS.items()
           for k, v in (("elems", elems), ("bytes", size))}}


def test_row_bytes_round_up_to_whole_blocks():
    assert limits.row_bytes("q8", 33) == 2 * limits.BLOCK_BYTES["q8"]
    assert limits.row_bytes("q4", 32) == limits.BLOCK_BYTES["q4"]
    assert limits.row_bytes("bf16", 33) == 66 and limits.row_bytes("f32", 3) == 12


def test_low_bit_rows_are_whole_blocks():
    assert limits.row_bytes("iq2_xxs", 512) == 2 * 66 and limits.row_bytes("iq4_nl", 64) == 2 * 18
    with pytest.raises(ValueError, match="not whole 256-element blocks"):
        limits.row_bytes("q2_k", 300)
