"""The wrapper program: a map-check prologue followed by the runtime's own instructions.

Every effective BPF_CGROUP_DEVICE program must return 1 for an access to pass,
so attaching one more "allow" program grants nothing. Instead each attached
program R is replaced by W = prologue + R: the prologue looks the device up in
a per-container hash map and allows it when the requested access is a subset
of the granted mask; otherwise it restores r1 = ctx and falls through into R,
which decides exactly as before. With the map empty, W behaves as R.

R is embedded (not tail-called): a program array is emptied by the kernel when
its last user-space reference closes, which would leave the container with no
devices at all once the agent exits. A hash map lives as long as W does.
"""

from __future__ import annotations

import struct

from hotmount.cgroups import bpf_asm as asm
from hotmount.cgroups.bpf_asm import Insn, Jmp, Op
from hotmount.devices.model import DeviceRule
from hotmount.errors import BpfError

WRAPPER_NAME = "hotmount_dev"  # prog names hold 15 characters
MAP_NAME = "hotmount_grants"
MAP_MAX_ENTRIES = 1024

# struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }
# access_type = (access << 16) | type
CTX_ACCESS_TYPE, CTX_MAJOR, CTX_MINOR = 0, 4, 8
DEV_TYPE = {"b": 1, "c": 2}  # BPF_DEVCG_DEV_BLOCK, BPF_DEVCG_DEV_CHAR
_KEY = struct.Struct("<III")  # {type, major, minor}
_VALUE = struct.Struct("<I")  # allowed access mask
KEY_SIZE, VALUE_SIZE = _KEY.size, _VALUE.size
_KEY_OFFSET = -16  # the key lives at r10-16 .. r10-5


class UnwrappableProgram(BpfError):
    reason = "UnwrappableProgram"


def map_key(rule: DeviceRule) -> bytes:
    return _KEY.pack(DEV_TYPE[rule.type], rule.major, rule.minor)


def map_value(rule: DeviceRule) -> bytes:
    return _VALUE.pack(rule.access)


def rule_from_entry(key: bytes, value: bytes) -> DeviceRule:
    dev_type, major, minor = _KEY.unpack(key)
    kind = {v: k for k, v in DEV_TYPE.items()}[dev_type]
    return DeviceRule(kind, major, minor, _VALUE.unpack(value)[0])


def prologue(map_fd: int) -> list[Insn]:
    """The map check; falls through to whatever follows with r1 = ctx."""
    fallthrough: list[Insn] = [asm.mov64_reg(1, 6)]  # r1 = ctx again
    allow = [asm.mov64_imm(0, 1), asm.exit_()]
    check = [
        asm.ldx_w(0, 0, 0),  # r0 = granted mask
        asm.alu32_reg(Op.AND, 0, 7),  # w0 &= requested
    ]
    check.append(asm.jmp_reg(Jmp.JNE, 0, 7, len(allow)))  # not all of it: fall through
    lookup = [
        *asm.ld_map_fd(1, map_fd),
        asm.mov64_reg(2, 10),
        asm.alu64_imm(Op.ADD, 2, _KEY_OFFSET),
        asm.call(asm.HELPER_MAP_LOOKUP_ELEM),
        asm.jmp_imm(Jmp.JEQ, 0, 0, len(check) + len(allow)),  # no entry: fall through
    ]
    build_key = [
        asm.mov64_reg(6, 1),  # r6 = ctx (callee-saved across the helper call)
        asm.ldx_w(7, 6, CTX_ACCESS_TYPE),
        asm.mov32_reg(2, 7),
        asm.alu32_imm(Op.AND, 2, 0xFFFF),  # w2 = device type
        asm.stx_w(10, _KEY_OFFSET, 2),
        asm.alu32_imm(Op.RSH, 7, 16),  # w7 = requested access
        asm.ldx_w(2, 6, CTX_MAJOR),
        asm.stx_w(10, _KEY_OFFSET + 4, 2),
        asm.ldx_w(2, 6, CTX_MINOR),
        asm.stx_w(10, _KEY_OFFSET + 8, 2),
    ]
    return build_key + lookup + check + allow + fallthrough


def check_wrappable(program: list[Insn]) -> None:
    """Refuse dumps that cannot be loaded again as they are."""
    if not program:
        raise UnwrappableProgram("the attached program is empty")
    for index, insn in enumerate(program):
        if insn.cls == asm.Cls.JMP and insn.code & 0xF0 == Jmp.CALL:
            raise UnwrappableProgram(f"instruction {index} calls a helper; cannot re-load it")
        if insn.code == asm.Cls.LD | asm.MODE_IMM | asm.SIZE_DW:
            raise UnwrappableProgram(f"instruction {index} loads a 64-bit immediate or a map")
        if asm.REG_AX in (insn.dst, insn.src):
            raise UnwrappableProgram(
                f"instruction {index} uses register 11: the dump is JIT-blinded "
                "(net.core.bpf_jit_harden); cannot re-load it"
            )


def wrap(original: list[Insn], map_fd: int) -> list[Insn]:
    check_wrappable(original)
    return prologue(map_fd) + original
