//! Length decoding and relocation of the first instructions of an x86-64 function, for the
//! inline launch hooks ([`super`]).
//!
//! Only what compilers put at a function's entry is understood: pushes, moves, ALU
//! operations with register/memory operands, `lea`, `endbr64`, multi-byte `nop`s, SSE
//! moves, direct calls and jumps (RIP-relative operands and branch targets are re-pointed),
//! short branches (widened to 32-bit displacements). Anything else is refused, and the hook
//! is then not installed: a wrong length would corrupt the program, a refusal only leaves
//! launches ungated.

/// Why the entry of a function cannot be displaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// An opcode this decoder does not know (offset, byte).
    Opcode(usize, u8),
    /// The function ends (ret, jmp) before enough bytes for the patch.
    TooShort(usize),
    /// A branch in the displaced bytes targets the displaced bytes themselves.
    InnerBranch(usize),
    /// A displaced RIP-relative operand or branch cannot reach its target from the
    /// trampoline (more than 2 GiB away).
    OutOfRange(usize),
    /// A breakpoint (a debugger or another tool is already there).
    Breakpoint(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Opcode(at, b) => write!(f, "unknown opcode {b:#04x} at +{at}"),
            Refused::TooShort(at) => write!(f, "the function returns or jumps away at +{at}"),
            Refused::InnerBranch(at) => write!(f, "a branch at +{at} targets the patched bytes"),
            Refused::OutOfRange(at) => write!(f, "the operand at +{at} is out of reach"),
            Refused::Breakpoint(at) => write!(f, "a breakpoint (int3) at +{at}"),
        }
    }
}

/// What must change when an instruction moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    None,
    /// A 32-bit displacement relative to the next instruction, at this offset in the
    /// instruction: a RIP-relative operand (false) or a `call`/`jmp`/`jcc` rel32 (true).
    Rel32(usize, bool),
    /// `jcc rel8` (the condition code): becomes `0f 8x rel32`.
    Jcc8(u8),
    /// `jmp rel8`: becomes `e9 rel32`.
    Jmp8,
}

/// One decoded instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    len: usize,
    fix: Fix,
    /// Execution does not fall through (ret, jmp).
    terminal: bool,
}

/// Bytes of `code` from `at`, or a refusal if the buffer ends (reported as an unknown
/// opcode at the end).
fn byte(code: &[u8], at: usize) -> Result<u8, Refused> {
    code.get(at).copied().ok_or(Refused::Opcode(at, 0))
}

/// ModRM (and SIB, displacement) starting at `at`. Returns (bytes, offset of a RIP-relative
/// disp32 within them, the ModRM reg field).
fn modrm(code: &[u8], at: usize) -> Result<(usize, Option<usize>, u8), Refused> {
    let m = byte(code, at)?;
    let (md, reg, rm) = (m >> 6, (m >> 3) & 7, m & 7);
    let mut n = 1;
    let mut rip = None;
    if md != 3 {
        if rm == 4 {
            let sib = byte(code, at + n)?;
            n += 1;
            if md == 0 && sib & 7 == 5 {
                n += 4;
            }
        } else if md == 0 && rm == 5 {
            rip = Some(n);
            n += 4;
        }
        match md {
            1 => n += 1,
            2 => n += 4,
            _ => {}
        }
    }
    Ok((n, rip, reg))
}

/// An instruction whose ModRM byte is at `i`, with `imm` immediate bytes after its operand.
fn modrm_insn(code: &[u8], i: usize, imm: usize) -> Result<Insn, Refused> {
    let (n, rip, _) = modrm(code, i)?;
    Ok(Insn {
        len: i + n + imm,
        fix: rip.map_or(Fix::None, |r| Fix::Rel32(i + r, false)),
        terminal: false,
    })
}

/// Decodes the instruction at `code[0..]`.
fn decode(code: &[u8]) -> Result<Insn, Refused> {
    let mut i = 0;
    let mut op16 = false;
    loop {
        match byte(code, i)? {
            0x66 => op16 = true,
            0xf2 | 0xf3 | 0xf0 | 0x2e | 0x3e | 0x26 | 0x36 | 0x64 | 0x65 => {}
            _ => break,
        }
        i += 1;
    }
    let mut rex_w = false;
    if let b @ 0x40..=0x4f = byte(code, i)? {
        rex_w = b & 8 != 0;
        i += 1;
    }
    let at = i;
    let op = byte(code, i)?;
    i += 1;
    let imm_z = if op16 { 2 } else { 4 };
    let plain = |len| {
        Ok(Insn {
            len,
            fix: Fix::None,
            terminal: false,
        })
    };
    let with_modrm = |i: usize, imm: usize| modrm_insn(code, i, imm);
    match op {
        0x0f => decode_0f(code, i),
        0xcc => Err(Refused::Breakpoint(at)),
        // ALU r/m forms, and AL/eAX immediates, of add/or/adc/sbb/and/sub/xor/cmp.
        0x00..=0x3f if op & 7 <= 3 => with_modrm(i, 0),
        0x00..=0x3f if op & 7 == 4 => plain(i + 1),
        0x00..=0x3f if op & 7 == 5 => plain(i + imm_z),
        0x50..=0x5f | 0x90..=0x99 => plain(i),
        0x63 | 0x84..=0x8b | 0x8d | 0x8f | 0xd0..=0xd3 | 0xfe => with_modrm(i, 0),
        0x68 => plain(i + 4),
        0x6a => plain(i + 1),
        0x69 | 0x81 | 0xc7 => with_modrm(i, imm_z),
        0x6b | 0x80 | 0x83 | 0xc0 | 0xc1 | 0xc6 => with_modrm(i, 1),
        0x70..=0x7f => Ok(Insn {
            len: i + 1,
            fix: Fix::Jcc8(op & 0x0f),
            terminal: false,
        }),
        0xa8 => plain(i + 1),
        0xa9 => plain(i + imm_z),
        0xb0..=0xb7 => plain(i + 1),
        0xb8..=0xbf => plain(i + if rex_w { 8 } else { imm_z }),
        0xc2 | 0xc3 => Err(Refused::TooShort(at)),
        0xe8 => Ok(Insn {
            len: i + 4,
            fix: Fix::Rel32(i, true),
            terminal: false,
        }),
        0xe9 => Ok(Insn {
            len: i + 4,
            fix: Fix::Rel32(i, true),
            terminal: true,
        }),
        0xeb => Ok(Insn {
            len: i + 1,
            fix: Fix::Jmp8,
            terminal: true,
        }),
        0xf6 | 0xf7 => {
            let (_, _, reg) = modrm(code, i)?;
            let imm = match (reg, op) {
                (0 | 1, 0xf6) => 1,
                (0 | 1, _) => imm_z,
                _ => 0,
            };
            with_modrm(i, imm)
        }
        0xff => {
            let (_, _, reg) = modrm(code, i)?;
            let mut insn = with_modrm(i, 0)?;
            insn.terminal = reg == 4 || reg == 5; // jmp r/m, jmp far
            Ok(insn)
        }
        _ => Err(Refused::Opcode(at, op)),
    }
}

/// Two-byte opcodes (`0f xx`), `i` just after the `0f`.
fn decode_0f(code: &[u8], i: usize) -> Result<Insn, Refused> {
    let op = byte(code, i)?;
    let i = i + 1;
    let with_modrm = |imm: usize| modrm_insn(code, i, imm);
    match op {
        // endbr64 (f3 0f 1e fa) and hint nops; SSE moves; cmov; setcc; imul; movzx/movsx;
        // SSE arithmetic and integer moves.
        0x10..=0x17 | 0x1e | 0x1f | 0x28..=0x2f | 0x40..=0x6f | 0x74..=0x76 | 0x7e | 0x7f => {
            with_modrm(0)
        }
        0x90..=0x9f | 0xaf | 0xb6 | 0xb7 | 0xbe | 0xbf | 0xd0..=0xfe => with_modrm(0),
        0x70..=0x73 | 0xc6 => with_modrm(1),
        0x80..=0x8f => Ok(Insn {
            len: i + 4,
            fix: Fix::Rel32(i, true),
            terminal: false,
        }),
        0xa2 => Ok(Insn {
            len: i,
            fix: Fix::None,
            terminal: false,
        }),
        _ => Err(Refused::Opcode(i - 1, op)),
    }
}

/// The displaced instructions of a function entry, ready to be written elsewhere.
#[derive(Debug)]
pub struct Displaced {
    /// Bytes of the original entry that the patch covers (whole instructions, ≥ the patch).
    pub len: usize,
    /// The relocated instructions followed by a `jmp` back to `entry + len` (unless the last
    /// displaced instruction never falls through).
    pub code: Vec<u8>,
}

/// Relocates the instructions covering at least `need` bytes of `code` (the first bytes of
/// the function at address `src`) to run at address `dst`.
pub fn displace(code: &[u8], src: u64, dst: u64, need: usize) -> Result<Displaced, Refused> {
    let mut insns = Vec::new();
    let mut off = 0;
    let mut terminal = false;
    while off < need {
        if terminal {
            return Err(Refused::TooShort(off));
        }
        let insn = decode(&code[off..]).map_err(|e| shift(e, off))?;
        terminal = insn.terminal;
        insns.push((off, insn));
        off += insn.len;
    }
    let len = off;
    let mut out = Vec::with_capacity(len + 16);
    for &(at, insn) in &insns {
        let bytes = &code[at..at + insn.len];
        let next_src = src as i64 + (at + insn.len) as i64;
        // The branch or operand target, absolute.
        let target = |disp: i64| next_src + disp;
        let inner = |t: i64| t >= src as i64 && t < src as i64 + len as i64;
        let rel32 = |t: i64, next_dst: i64| {
            i32::try_from(t - next_dst).map_err(|_| Refused::OutOfRange(at))
        };
        match insn.fix {
            Fix::None => out.extend_from_slice(bytes),
            Fix::Rel32(p, is_branch) => {
                let d = i32::from_le_bytes([bytes[p], bytes[p + 1], bytes[p + 2], bytes[p + 3]]);
                let t = target(i64::from(d));
                if is_branch && inner(t) {
                    return Err(Refused::InnerBranch(at));
                }
                let next_dst = dst as i64 + (out.len() + insn.len) as i64;
                let nd = rel32(t, next_dst)?;
                out.extend_from_slice(&bytes[..p]);
                out.extend_from_slice(&nd.to_le_bytes());
                out.extend_from_slice(&bytes[p + 4..]);
            }
            Fix::Jcc8(cc) => {
                let t = target(i64::from(bytes[insn.len - 1] as i8));
                if inner(t) {
                    return Err(Refused::InnerBranch(at));
                }
                let next_dst = dst as i64 + (out.len() + 6) as i64;
                let nd = rel32(t, next_dst)?;
                out.extend_from_slice(&[0x0f, 0x80 | cc]);
                out.extend_from_slice(&nd.to_le_bytes());
            }
            Fix::Jmp8 => {
                let t = target(i64::from(bytes[insn.len - 1] as i8));
                if inner(t) {
                    return Err(Refused::InnerBranch(at));
                }
                let next_dst = dst as i64 + (out.len() + 5) as i64;
                let nd = rel32(t, next_dst)?;
                out.push(0xe9);
                out.extend_from_slice(&nd.to_le_bytes());
            }
        }
    }
    if !terminal {
        let back = src as i64 + len as i64;
        let next_dst = dst as i64 + (out.len() + 5) as i64;
        let nd = i32::try_from(back - next_dst).map_err(|_| Refused::OutOfRange(len))?;
        out.push(0xe9);
        out.extend_from_slice(&nd.to_le_bytes());
    }
    Ok(Displaced { len, code: out })
}

/// A refusal from an instruction at `off` reported relative to the function's entry.
fn shift(e: Refused, off: usize) -> Refused {
    match e {
        Refused::Opcode(a, b) => Refused::Opcode(a + off, b),
        Refused::TooShort(a) => Refused::TooShort(a + off),
        Refused::InnerBranch(a) => Refused::InnerBranch(a + off),
        Refused::OutOfRange(a) => Refused::OutOfRange(a + off),
        Refused::Breakpoint(a) => Refused::Breakpoint(a + off),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len(code: &[u8]) -> usize {
        decode(code).expect("decodes").len
    }

    #[test]
    fn lengths_of_common_entry_instructions() {
        assert_eq!(len(&[0xf3, 0x0f, 0x1e, 0xfa]), 4); // endbr64
        assert_eq!(len(&[0x55]), 1); // push rbp
        assert_eq!(len(&[0x41, 0x57]), 2); // push r15
        assert_eq!(len(&[0x48, 0x89, 0xe5]), 3); // mov rbp, rsp
        assert_eq!(len(&[0x48, 0x83, 0xec, 0x28]), 4); // sub rsp, 0x28
        assert_eq!(len(&[0x48, 0x81, 0xec, 0, 1, 0, 0]), 7); // sub rsp, 0x100
        assert_eq!(len(&[0x48, 0x8b, 0x05, 1, 2, 3, 4]), 7); // mov rax, [rip+x]
        assert_eq!(len(&[0x4c, 0x8d, 0x44, 0x24, 0x08]), 5); // lea r8, [rsp+8]
        assert_eq!(len(&[0x48, 0x8b, 0x84, 0x24, 0, 1, 0, 0]), 8); // mov rax, [rsp+0x100]
        assert_eq!(len(&[0x31, 0xc0]), 2); // xor eax, eax
        assert_eq!(len(&[0xb8, 1, 0, 0, 0]), 5); // mov eax, 1
        assert_eq!(len(&[0x48, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0]), 10); // movabs rax, imm64
        assert_eq!(len(&[0x66, 0xc7, 0x00, 1, 0]), 5); // mov word [rax], 1
        assert_eq!(len(&[0xf7, 0xc7, 1, 0, 0, 0]), 6); // test edi, 1
        assert_eq!(len(&[0xf7, 0xd8]), 2); // neg eax
        assert_eq!(len(&[0x0f, 0x1f, 0x44, 0, 0]), 5); // nop dword [rax+rax]
        assert_eq!(len(&[0x0f, 0xb6, 0x07]), 3); // movzx eax, byte [rdi]
        assert_eq!(len(&[0x66, 0x0f, 0x6f, 0x05, 1, 2, 3, 4]), 8); // movdqa xmm0, [rip+x]
        assert_eq!(len(&[0xff, 0x25, 1, 2, 3, 4]), 6); // jmp [rip+x]
        assert_eq!(len(&[0x8b, 0x04, 0x25, 1, 2, 3, 4]), 7); // mov eax, [abs32] (SIB, no base)
    }

    #[test]
    fn unknown_and_unsafe_entries_are_refused() {
        assert_eq!(decode(&[0xcc]), Err(Refused::Breakpoint(0)));
        assert_eq!(decode(&[0x0f, 0x0b]), Err(Refused::Opcode(1, 0x0b))); // ud2
        assert_eq!(decode(&[0xc5, 0xf8, 0x77]), Err(Refused::Opcode(0, 0xc5))); // VEX
        // ret before 5 bytes: the next function's bytes would be overwritten.
        assert_eq!(
            displace(&[0x31, 0xc0, 0xc3, 0x90, 0x90, 0x90], 0x1000, 0x2000, 5).unwrap_err(),
            Refused::TooShort(2)
        );
        // jmp rel8 then more bytes: same.
        assert_eq!(
            displace(&[0xeb, 0x10, 0x90, 0x90, 0x90], 0x1000, 0x2000, 5).unwrap_err(),
            Refused::TooShort(2)
        );
        // A short branch back into the displaced bytes.
        assert_eq!(
            displace(&[0x90, 0x90, 0x75, 0xfc, 0x90, 0x90], 0x1000, 0x2000, 5).unwrap_err(),
            Refused::InnerBranch(2)
        );
    }

    #[test]
    fn the_simulators_entry_moves_unchanged_with_a_jump_back() {
        // push rbp; mov rbp, rsp; pop rbp; jmp impl
        let code = [0x55, 0x48, 0x89, 0xe5, 0x5d, 0xe9, 0, 0, 0, 0];
        let d = displace(&code, 0x10_0000, 0x20_0000, 5).unwrap();
        assert_eq!(d.len, 5);
        assert_eq!(&d.code[..5], &code[..5]);
        assert_eq!(d.code[5], 0xe9);
        let rel = i32::from_le_bytes(d.code[6..10].try_into().unwrap());
        assert_eq!(0x20_0000 + 10 + i64::from(rel), 0x10_0005);
    }

    #[test]
    fn rip_relative_operands_and_branches_keep_their_targets() {
        // mov rax, [rip + 0x100] ; call +0x20 (at 0x1000: targets 0x1107 and 0x102c)
        let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0, 0, 0xe8, 0x20, 0, 0, 0];
        let (src, dst) = (0x1000_i64, 0x9000_i64);
        let d = displace(&code, src as u64, dst as u64, 5).unwrap();
        assert_eq!(d.len, 7);
        let disp = i64::from(i32::from_le_bytes(d.code[3..7].try_into().unwrap()));
        assert_eq!(dst + 7 + disp, src + 7 + 0x100);
        // Only the first instruction was needed; then the jump back to src + 7.
        let back = i64::from(i32::from_le_bytes(d.code[8..12].try_into().unwrap()));
        assert_eq!(dst + 12 + back, src + 7);
        // call at the start: re-pointed, and execution comes back after it.
        let d = displace(&code[7..], src as u64, dst as u64, 5).unwrap();
        let rel = i64::from(i32::from_le_bytes(d.code[1..5].try_into().unwrap()));
        assert_eq!(dst + 5 + rel, src + 5 + 0x20);
    }

    #[test]
    fn short_conditional_branches_are_widened() {
        // test edi, edi ; je +0x30 ; push rbx
        let code = [0x85, 0xff, 0x74, 0x30, 0x53];
        let (src, dst) = (0x4000_i64, 0x8000_i64);
        let d = displace(&code, src as u64, dst as u64, 5).unwrap();
        assert_eq!(d.len, 5);
        assert_eq!(&d.code[..2], &[0x85, 0xff]);
        assert_eq!(&d.code[2..4], &[0x0f, 0x84]);
        let rel = i64::from(i32::from_le_bytes(d.code[4..8].try_into().unwrap()));
        assert_eq!(dst + 8 + rel, src + 4 + 0x30);
        assert_eq!(d.code[8], 0x53);
    }

    #[test]
    fn a_leading_jump_is_the_whole_trampoline() {
        // jmp rel32 (a thunk): the trampoline jumps to the same target, no jump back.
        let code = [0xe9, 0x00, 0x10, 0, 0];
        let d = displace(&code, 0x1000, 0x3000, 5).unwrap();
        assert_eq!(d.code.len(), 5);
        let rel = i64::from(i32::from_le_bytes(d.code[1..5].try_into().unwrap()));
        assert_eq!(0x3000 + 5 + rel, 0x1000 + 5 + 0x1000);
    }

    #[test]
    fn far_targets_are_refused() {
        let code = [0x48, 0x8b, 0x05, 0, 0, 0, 0];
        assert_eq!(
            displace(&code, 0x1000, 0x1_0000_0000, 5).unwrap_err(),
            Refused::OutOfRange(0)
        );
    }
}
