"""eBPF instructions as data: encode, decode and print them. Pure, no syscalls.

Only what device programs use: ALU/ALU64, loads and stores of words, jumps,
calls, exit and the 64-bit immediate load of a map. The listing format follows
the kernel's verifier/bpftool output so that a golden listing reads like a dump.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum


class Cls(IntEnum):
    LD = 0x00
    LDX = 0x01
    ST = 0x02
    STX = 0x03
    ALU = 0x04
    JMP = 0x05
    JMP32 = 0x06
    ALU64 = 0x07


class Op(IntEnum):
    ADD = 0x00
    SUB = 0x10
    MUL = 0x20
    DIV = 0x30
    OR = 0x40
    AND = 0x50
    LSH = 0x60
    RSH = 0x70
    NEG = 0x80
    MOD = 0x90
    XOR = 0xA0
    MOV = 0xB0
    ARSH = 0xC0


class Jmp(IntEnum):
    JA = 0x00
    JEQ = 0x10
    JGT = 0x20
    JGE = 0x30
    JSET = 0x40
    JNE = 0x50
    JSGT = 0x60
    JSGE = 0x70
    CALL = 0x80
    EXIT = 0x90
    JLT = 0xA0
    JLE = 0xB0
    JSLT = 0xC0
    JSLE = 0xD0


SRC_K = 0x00
SRC_X = 0x08
SIZE_W = 0x00
SIZE_DW = 0x18
MODE_IMM = 0x00
MODE_MEM = 0x60
PSEUDO_MAP_FD = 1
HELPER_MAP_LOOKUP_ELEM = 1
REG_AX = 11  # the JIT's hidden register (constant blinding); never in a loadable program

_FORMAT = struct.Struct("<BBhi")


@dataclass(frozen=True)
class Insn:
    code: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0

    def encode(self) -> bytes:
        return _FORMAT.pack(self.code, (self.src << 4) | self.dst, self.off, self.imm)

    @property
    def cls(self) -> int:
        return self.code & 0x07


def encode(program: list[Insn]) -> bytes:
    return b"".join(insn.encode() for insn in program)


def decode(blob: bytes) -> list[Insn]:
    if len(blob) % 8:
        raise ValueError(f"a program is a multiple of 8 bytes, not {len(blob)}")
    out = []
    for offset in range(0, len(blob), 8):
        code, regs, off, imm = _FORMAT.unpack_from(blob, offset)
        out.append(Insn(code, regs & 0x0F, regs >> 4, off, imm))
    return out


# Builders, named as in the kernel's filter.h macros.
def mov64_reg(dst: int, src: int) -> Insn:
    return Insn(Cls.ALU64 | Op.MOV | SRC_X, dst, src)


def mov64_imm(dst: int, imm: int) -> Insn:
    return Insn(Cls.ALU64 | Op.MOV | SRC_K, dst, 0, 0, imm)


def mov32_reg(dst: int, src: int) -> Insn:
    return Insn(Cls.ALU | Op.MOV | SRC_X, dst, src)


def alu32_imm(op: Op, dst: int, imm: int) -> Insn:
    return Insn(Cls.ALU | op | SRC_K, dst, 0, 0, imm)


def alu32_reg(op: Op, dst: int, src: int) -> Insn:
    return Insn(Cls.ALU | op | SRC_X, dst, src)


def alu64_imm(op: Op, dst: int, imm: int) -> Insn:
    return Insn(Cls.ALU64 | op | SRC_K, dst, 0, 0, imm)


def ldx_w(dst: int, src: int, off: int) -> Insn:
    return Insn(Cls.LDX | MODE_MEM | SIZE_W, dst, src, off)


def stx_w(dst: int, off: int, src: int) -> Insn:
    return Insn(Cls.STX | MODE_MEM | SIZE_W, dst, src, off)


def ld_map_fd(dst: int, fd: int) -> list[Insn]:
    return [Insn(Cls.LD | MODE_IMM | SIZE_DW, dst, PSEUDO_MAP_FD, 0, fd), Insn(0)]


def jmp_imm(op: Jmp, dst: int, imm: int, off: int) -> Insn:
    return Insn(Cls.JMP | op | SRC_K, dst, 0, off, imm)


def jmp_reg(op: Jmp, dst: int, src: int, off: int) -> Insn:
    return Insn(Cls.JMP | op | SRC_X, dst, src, off)


def call(helper: int) -> Insn:
    return Insn(Cls.JMP | Jmp.CALL, imm=helper)


def exit_() -> Insn:
    return Insn(Cls.JMP | Jmp.EXIT)


_ALU_SYMBOL = {
    Op.ADD: "+=",
    Op.SUB: "-=",
    Op.MUL: "*=",
    Op.DIV: "/=",
    Op.OR: "|=",
    Op.AND: "&=",
    Op.LSH: "<<=",
    Op.RSH: ">>=",
    Op.MOD: "%=",
    Op.XOR: "^=",
    Op.MOV: "=",
    Op.ARSH: "s>>=",
}
_JMP_SYMBOL = {
    Jmp.JEQ: "==",
    Jmp.JGT: ">",
    Jmp.JGE: ">=",
    Jmp.JSET: "&",
    Jmp.JNE: "!=",
    Jmp.JSGT: "s>",
    Jmp.JSGE: "s>=",
    Jmp.JLT: "<",
    Jmp.JLE: "<=",
    Jmp.JSLT: "s<",
    Jmp.JSLE: "s<=",
}
_SIZE_NAME = {0x00: "u32", 0x08: "u16", 0x10: "u8", 0x18: "u64"}


def format_insn(insn: Insn) -> str:
    """One instruction in bpftool's `dump xlated` notation."""
    cls, op, src_x = insn.cls, insn.code & 0xF0, insn.code & SRC_X
    if cls in (Cls.ALU, Cls.ALU64):
        reg = "w" if cls == Cls.ALU else "r"
        rhs = f"{reg}{insn.src}" if src_x else str(insn.imm)
        if op == Op.NEG:
            return f"{reg}{insn.dst} = -{reg}{insn.dst}"
        return f"{reg}{insn.dst} {_ALU_SYMBOL[Op(op)]} {rhs}"
    if cls == Cls.LDX:
        size = _SIZE_NAME[insn.code & 0x18]
        return f"r{insn.dst} = *({size} *)(r{insn.src} {insn.off:+d})"
    if cls == Cls.STX:
        size = _SIZE_NAME[insn.code & 0x18]
        return f"*({size} *)(r{insn.dst} {insn.off:+d}) = r{insn.src}"
    if cls == Cls.ST:
        size = _SIZE_NAME[insn.code & 0x18]
        return f"*({size} *)(r{insn.dst} {insn.off:+d}) = {insn.imm}"
    if cls == Cls.LD and insn.code == Cls.LD | MODE_IMM | SIZE_DW:
        what = "map_fd" if insn.src == PSEUDO_MAP_FD else "imm64"
        return f"r{insn.dst} = {what}({insn.imm}) ll"
    if cls in (Cls.JMP, Cls.JMP32):
        if op == Jmp.EXIT:
            return "exit"
        if op == Jmp.CALL:
            return f"call {insn.imm}"
        if op == Jmp.JA:
            return f"goto pc{insn.off:+d}"
        reg = "w" if cls == Cls.JMP32 else "r"
        rhs = f"{reg}{insn.src}" if src_x else hex(insn.imm)
        return f"if {reg}{insn.dst} {_JMP_SYMBOL[Jmp(op)]} {rhs} goto pc{insn.off:+d}"
    if insn.code == 0 and insn.dst == insn.src == insn.off == insn.imm == 0:
        return "(second half of ld_imm64)"
    return f"(code {insn.code:#04x})"


def listing(program: list[Insn]) -> str:
    return "\n".join(f"{i:3d}: {format_insn(insn)}" for i, insn in enumerate(program))
