"""The wrapper program: a golden listing of the map-check prologue, and what wrap() refuses.

A reviewer reads the listing, not bytes (as runc's devicefilter_test.go does).
"""

from __future__ import annotations

import pytest

from hotmount.cgroups import bpf_asm as asm
from hotmount.cgroups.bpf_asm import Insn, Jmp, Op
from hotmount.cgroups.prologue import (
    KEY_SIZE,
    VALUE_SIZE,
    UnwrappableProgram,
    check_wrappable,
    map_key,
    map_value,
    prologue,
    rule_from_entry,
    wrap,
)
from hotmount.devices.model import DeviceRule

# struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }
# access_type = (access << 16) | type; the key {type, major, minor} lives at r10-16.
GOLDEN_PROLOGUE = """\
  0: r6 = r1
  1: r7 = *(u32 *)(r6 +0)
  2: w2 = w7
  3: w2 &= 65535
  4: *(u32 *)(r10 -16) = r2
  5: w7 >>= 16
  6: r2 = *(u32 *)(r6 +4)
  7: *(u32 *)(r10 -12) = r2
  8: r2 = *(u32 *)(r6 +8)
  9: *(u32 *)(r10 -8) = r2
 10: r1 = map_fd(7) ll
 11: (second half of ld_imm64)
 12: r2 = r10
 13: r2 += -16
 14: call 1
 15: if r0 == 0x0 goto pc+5
 16: r0 = *(u32 *)(r0 +0)
 17: w0 &= w7
 18: if r0 != r7 goto pc+2
 19: r0 = 1
 20: exit
 21: r1 = r6"""
# What each line does:
#   0      r6 = ctx (callee-saved: the helper call clobbers r1-r5)
#   1-5    key.type = access_type & 0xffff; w7 = requested access (access_type >> 16)
#   6-9    key.major, key.minor
#   10-14  r0 = bpf_map_lookup_elem(map, &key)
#   15     no entry: fall through to 21
#   16-18  granted & requested != requested: fall through to 21
#   19-20  return 1 (allow)
#   21     r1 = ctx again; the runtime's own program follows and decides as before
FALLTHROUGH = 21

# A runc-style device program (from runc's devicefilter_test.go, trimmed): allow
# c 1:3 rwm, deny everything else.
RUNC_LIKE = [
    asm.ldx_w(2, 1, 0),  # r2 = access_type
    asm.alu32_imm(Op.AND, 2, 0xFFFF),  # w2 = type
    asm.ldx_w(3, 1, 0),
    asm.alu32_imm(Op.RSH, 3, 16),  # w3 = access
    asm.ldx_w(4, 1, 4),  # r4 = major
    asm.ldx_w(5, 1, 8),  # r5 = minor
    asm.jmp_imm(Jmp.JNE, 2, 2, 5),  # not char: next block
    asm.jmp_imm(Jmp.JNE, 4, 1, 4),
    asm.jmp_imm(Jmp.JNE, 5, 3, 3),
    asm.mov64_imm(0, 1),
    asm.exit_(),
    Insn(asm.Cls.JMP | Jmp.JA, off=0),  # goto +0 (harmless, as in real dumps)
    asm.mov64_imm(0, 0),
    asm.exit_(),
]


def test_golden_prologue_listing() -> None:
    assert asm.listing(prologue(map_fd=7)) == GOLDEN_PROLOGUE


def test_prologue_map_fd_lands_in_the_ld_imm64() -> None:
    program = prologue(map_fd=42)
    assert program[10] == Insn(0x18, dst=1, src=asm.PSEUDO_MAP_FD, imm=42)
    assert program[11] == Insn(0)


def jump_target(program: list[Insn], index: int) -> int:
    return index + 1 + program[index].off


def test_every_prologue_fallthrough_lands_on_restoring_ctx() -> None:
    program = wrap(RUNC_LIKE, map_fd=7)
    jumps = [
        i
        for i, insn in enumerate(program[:FALLTHROUGH])
        if insn.cls == asm.Cls.JMP and insn.code & 0xF0 not in (Jmp.CALL, Jmp.EXIT)
    ]
    assert jumps == [15, 18]
    assert {jump_target(program, i) for i in jumps} == {FALLTHROUGH}
    assert program[FALLTHROUGH] == asm.mov64_reg(1, 6)
    assert asm.format_insn(program[FALLTHROUGH]) == "r1 = r6"


def test_wrap_keeps_the_original_byte_identical_after_the_prologue() -> None:
    program = wrap(RUNC_LIKE, map_fd=7)
    head = len(prologue(7))
    assert head == FALLTHROUGH + 1
    assert program[:head] == prologue(7)
    assert asm.encode(program[head:]) == asm.encode(RUNC_LIKE)
    # Relative jumps inside the original still land where they did.
    for i, insn in enumerate(RUNC_LIKE):
        if insn.cls == asm.Cls.JMP and insn.code & 0xF0 not in (Jmp.CALL, Jmp.EXIT):
            assert jump_target(program, head + i) == head + jump_target(RUNC_LIKE, i)


@pytest.mark.parametrize(
    ("program", "says"),
    [
        ([], "empty"),
        ([*RUNC_LIKE[:-2], asm.call(asm.HELPER_MAP_LOOKUP_ELEM), *RUNC_LIKE[-2:]], "helper"),
        ([asm.call(5), asm.exit_()], "helper"),
        ([*asm.ld_map_fd(1, 3), asm.mov64_imm(0, 1), asm.exit_()], "64-bit immediate"),
        ([Insn(0x18, dst=2, imm=1), Insn(0), asm.mov64_imm(0, 1), asm.exit_()], "64-bit"),
        ([asm.mov64_imm(11, 0x1234), asm.mov64_reg(0, 11), asm.exit_()], "register 11"),
        ([asm.ldx_w(2, 1, 0), asm.alu64_imm(Op.XOR, 11, 5), asm.exit_()], "register 11"),
    ],
    ids=["empty", "helper-call-inside", "helper-call-first", "map-load", "imm64-load",
         "jit-blinded-dst", "jit-blinded-alu"],
)  # fmt: skip
def test_check_wrappable_refuses(program: list[Insn], says: str) -> None:
    with pytest.raises(UnwrappableProgram, match=says) as caught:
        wrap(program, map_fd=7)
    assert caught.value.reason == "UnwrappableProgram"


@pytest.mark.parametrize(
    "program",
    [RUNC_LIKE, [asm.mov64_imm(0, 1), asm.exit_()], [asm.mov64_imm(0, 0), asm.exit_()]],
    ids=["runc-like", "allow-all", "deny-all"],
)
def test_check_wrappable_accepts_plain_device_programs(program: list[Insn]) -> None:
    check_wrappable(program)
    assert wrap(program, 3)[-len(program) :] == program


@pytest.mark.parametrize(
    "program",
    [RUNC_LIKE, prologue(7), [asm.jmp_imm(Jmp.JEQ, 3, -1, -32768), Insn(0xFF, 15, 15, 32767, -1)]],
    ids=["runc-like", "prologue", "extremes"],
)
def test_decode_inverts_encode(program: list[Insn]) -> None:
    blob = asm.encode(program)
    assert len(blob) == 8 * len(program)
    assert asm.decode(blob) == program


def test_decode_refuses_a_partial_instruction() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        asm.decode(b"\x00" * 12)


def test_encoding_of_one_instruction_matches_the_kernel_layout() -> None:
    # struct bpf_insn { u8 code; u8 dst_reg:4, src_reg:4; s16 off; s32 imm; }, little-endian
    assert asm.ldx_w(7, 6, 4).encode() == bytes([0x61, 0x67, 4, 0, 0, 0, 0, 0])
    assert asm.alu64_imm(Op.ADD, 2, -16).encode() == bytes([0x07, 0x02, 0, 0]) + b"\xf0\xff\xff\xff"


@pytest.mark.parametrize(
    ("rule", "key", "value"),
    [
        (DeviceRule("c", 195, 0, 6), (2, 195, 0), 6),
        (DeviceRule("c", 195, 255, 7), (2, 195, 255), 7),
        (DeviceRule("b", 8, 16, 2), (1, 8, 16), 2),
        (DeviceRule("c", 4095, (1 << 20) - 1, 1), (2, 4095, (1 << 20) - 1), 1),
    ],
    ids=["gpu0-rw", "nvidiactl-rwm", "block-r", "max-numbers"],
)
def test_map_entries_round_trip(rule: DeviceRule, key: tuple[int, int, int], value: int) -> None:
    raw_key, raw_value = map_key(rule), map_value(rule)
    assert (len(raw_key), len(raw_value)) == (KEY_SIZE, VALUE_SIZE) == (12, 4)
    assert raw_key == b"".join(n.to_bytes(4, "little") for n in key)
    assert raw_value == value.to_bytes(4, "little")
    assert rule_from_entry(raw_key, raw_value) == rule
