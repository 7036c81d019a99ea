//! Every exported cu*/nvml* function must start with an instruction a uprobe can probe:
//! never a `lock` prefix (0xF0), and by construction `push rbp` (0x55), optionally after
//! `endbr64`. Reads the built library's ELF dynamic symbol table directly.

mod common;

fn u16_at(b: &[u8], o: usize) -> usize {
    u16::from_le_bytes([b[o], b[o + 1]]) as usize
}
fn u32_at(b: &[u8], o: usize) -> usize {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes")) as usize
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

struct Section {
    kind: usize,
    addr: u64,
    offset: usize,
    size: usize,
    link: usize,
}

/// (name, file bytes at the symbol) for every defined FUNC in .dynsym.
fn exported_functions(elf: &[u8]) -> Vec<(String, Vec<u8>)> {
    assert_eq!(&elf[..4], b"\x7fELF");
    assert_eq!(elf[4], 2, "ELF64");
    let (shoff, shentsize, shnum) = (
        u64_at(elf, 0x28) as usize,
        u16_at(elf, 0x3a),
        u16_at(elf, 0x3c),
    );
    let sections: Vec<Section> = (0..shnum)
        .map(|i| {
            let s = shoff + i * shentsize;
            Section {
                kind: u32_at(elf, s + 4),
                addr: u64_at(elf, s + 0x10),
                offset: u64_at(elf, s + 0x18) as usize,
                size: u64_at(elf, s + 0x20) as usize,
                link: u32_at(elf, s + 0x28),
            }
        })
        .collect();
    let dynsym = sections.iter().find(|s| s.kind == 11).expect(".dynsym");
    let strtab = &sections[dynsym.link];
    let mut out = Vec::new();
    for i in 0..dynsym.size / 24 {
        let e = dynsym.offset + i * 24;
        let (name_off, info, shndx, value) = (
            u32_at(elf, e),
            elf[e + 4],
            u16_at(elf, e + 6),
            u64_at(elf, e + 8),
        );
        if info & 0xf != 2 || shndx == 0 {
            continue; // not a defined function
        }
        let start = strtab.offset + name_off;
        let end = start + elf[start..].iter().position(|&c| c == 0).expect("NUL");
        let name = String::from_utf8_lossy(&elf[start..end]).into_owned();
        let sec = &sections[shndx];
        let off = sec.offset + (value - sec.addr) as usize;
        out.push((name, elf[off..off + 8].to_vec()));
    }
    out
}

#[test]
fn exported_entry_points_start_with_a_probeable_instruction() {
    let elf = std::fs::read(common::lib_path()).expect("read library");
    let funcs: Vec<_> = exported_functions(&elf)
        .into_iter()
        .filter(|(n, _)| n.starts_with("cu") || n.starts_with("nvml"))
        .collect();
    for want in [
        "cuInit",
        "cuGetProcAddress_v2",
        "cuMemAlloc_v2",
        "cuLaunchKernel_ptsz",
        "nvmlInit_v2",
    ] {
        assert!(funcs.iter().any(|(n, _)| n == want), "{want} not exported");
    }
    assert!(funcs.len() >= 90, "only {} entry points", funcs.len());
    for (name, bytes) in &funcs {
        assert_ne!(bytes[0], 0xf0, "{name} starts with a lock prefix");
        let body = if bytes[..4] == [0xf3, 0x0f, 0x1e, 0xfa] {
            &bytes[4..]
        } else {
            &bytes[..]
        };
        assert_eq!(
            body[0], 0x55,
            "{name} does not start with push rbp: {bytes:02x?}"
        );
    }
}
