//! `cargo xtask layers`: imports run one way. A crate's top-level modules are listed in
//! layers, bottom first (the data below); a module may use its own layer's modules and those
//! below it, never one above. A `crate::NAME` path or a use of a macro that another module
//! defines (`macro_rules!`) counts as using that module. A module missing from the list, or
//! listed but gone, fails too, so that the list stays the crate's map (docs/architecture.md).
//!
//! The modules of one layer do not use each other, except those the crate lists as a loop:
//! today's import loops, each named in docs/architecture.md with the reason (issue 27 removes
//! them); the check keeps a new import from running back up, or a new loop from forming,
//! meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::util::{root, step};

/// One crate's source folder and its layers, bottom first.
pub struct Crate {
    pub src: &'static str,
    /// How the crate's code names one of these modules by path: `crate::` for a crate's
    /// top-level modules, `crate::agent::` for those of the agent's `agent/` folder. Siblings
    /// reached with `super::` count too.
    pub prefix: &'static str,
    pub layers: &'static [&'static [&'static str]],
    /// Modules of one layer that may use each other (an import loop, named in
    /// docs/architecture.md with the reason).
    pub loops: &'static [&'static [&'static str]],
}

/// The shim (libfgpu.so), bottom first.
pub const SHIM: Crate = Crate {
    src: "shim/src",
    prefix: "crate::",
    layers: &[
        // What lower modules call back up into (registered by lib.rs); the coarse clock and
        // reopening a descriptor: use nothing of the crate.
        &["registered", "sys"],
        // Logging, the real entry points and the interposition table.
        &["log", "real", "table"],
        // The environment, read once.
        &["config"],
        // The agent connection: hands descriptors and mappings up to the ledger, which
        // drives it (first contact, reconnects).
        &["agent_link"],
        // Where the ledger comes from, this process's slot, migration after an agent restart.
        &["ledger"],
        // The accounting core (its hooks into cuda's context and pool are registered by
        // lib.rs).
        &["account"],
        // Parking: memory backed for parking, park and unpark, the door launches, copies and
        // allocations pass (its hook into the launch fast paths is registered by lib.rs).
        &["park"],
        // The launch gate (CUDA's and HIP's GateApi tables and its hooks for the agent link
        // are registered by lib.rs).
        &["gate"],
        // CUDA's and NVML's wrappers over the accounting, and the launch entry points over
        // the gate; cuGetProcAddress and the table of every wrapper.
        &["cuda"],
        // HIP, ROCm SMI and AMD SMI (its table of wrappers uses cuda's wrap_table! macro, its
        // launch entry points cuda's launch helpers).
        &["hip"],
        // Over the rest, used only by lib.rs: the dlsym interposition, the inline launch
        // hooks, the fork handler.
        &["dlsym", "fork", "hook"],
    ],
    loops: &[],
};

/// The shim's `ledger/` folder, bottom first: where a ledger comes from, the ledger in use
/// and its slot, migration after an agent restart (`mod.rs` on top).
pub const SHIM_LEDGER: Crate = Crate {
    src: "shim/src/ledger",
    prefix: "crate::ledger::",
    layers: &[&["sources"], &["view"], &["reconnect"]],
    loops: &[],
};

/// The shim's `cuda/` folder, bottom first (`mod.rs` on top, with CUDA's GateApi table).
pub const SHIM_CUDA: Crate = Crate {
    src: "shim/src/cuda",
    prefix: "crate::cuda::",
    layers: &[
        // NVML's answers and the shim's own NVML queries; memory pools.
        &["nvml", "pool"],
        // The context overhead (measured through nvml).
        &["context"],
        // The allocation wrappers, memory info, and the launch entry points over the gate.
        &["alloc", "array", "copies", "launch", "meminfo", "vmm"],
        // cuGetProcAddress and the table of every wrapper.
        &["gpa"],
    ],
    loops: &[],
};

/// The agent's `agent/` folder (the node daemon), bottom first (docs/architecture.md, its
/// module list).
pub const AGENT: Crate = Crate {
    src: "fgpu-agent/src/agent",
    prefix: "crate::agent::",
    layers: &[
        // Facts of the node and the kernel, each on its own.
        &[
            "cgroups",
            "containers",
            "discovery",
            "doors",
            "enforcer",
            "gpus",
            "hostns",
            "kernel",
            "logging",
            "ownpod",
            "pathindex",
            "pins",
            "preflight",
            "request",
            "scm",
            "smi",
        ],
        &[
            "bound", "gpusel", "limits", "pidfd", "probes", "shared", "targets",
        ],
        &["adopt", "backstop", "devmap", "peer", "shims", "watcher"],
        // The ledgers and the compute controller that schedules them.
        &["compute", "ledgers"],
        // Parking's broker and dead slots' reclaim (over the ledgers).
        &["park", "reclaim"],
        // The shared state: every part, behind its methods.
        &["state"],
        // Whose a caller is: the key of the connection caps and of the ledger bound.
        &["tenant"],
        &["budget", "events", "unseen"],
        &["enforce", "publisher", "report"],
        // The one place that reacts to a limit change; the metrics listener.
        &["apply", "metrics"],
        &["control"],
        &["server"],
    ],
    // docs/architecture.md, "The agent's import loop": ROCm SMI fills `gpus`' devices where
    // NVML is missing; `ledgers` uses `compute`'s scheduler and teams, `compute`'s
    // controller (compute/mod.rs) the ledgers: a loop of folders, not of files.
    loops: &[&["gpus", "smi"], &["compute", "ledgers"]],
};

/// An import that runs up, or sideways outside a listed loop: `from` uses `to`.
#[derive(Debug, PartialEq, Eq)]
pub struct Violation {
    pub file: PathBuf,
    pub line: usize,
    pub from: String,
    pub to: String,
    pub what: String,
}

/// Checks one crate under `root`; returns the imports that run up, or an error for a module
/// the layers do not list (or list but the crate lacks).
pub fn check(root: &Path, krate: &Crate) -> Result<Vec<Violation>> {
    let src = root.join(krate.src);
    let mut layer_of: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, layer) in krate.layers.iter().enumerate() {
        for m in *layer {
            if layer_of.insert(m, i).is_some() {
                bail!("{}: module {m} is listed twice", krate.src);
            }
        }
    }
    let files = rust_files(&src)?;
    let mut modules: BTreeSet<String> = BTreeSet::new();
    // Macro name -> the modules that define it.
    let mut macros: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut texts = Vec::new();
    for f in &files {
        let path = module_path(&src, f);
        let Some(module) = path.first().cloned() else {
            continue;
        };
        let text = std::fs::read_to_string(f).with_context(|| format!("{}", f.display()))?;
        for name in macro_names(&text) {
            macros.entry(name).or_default().push(module.clone());
        }
        modules.insert(module.clone());
        texts.push((f.clone(), module, path, text));
    }
    let missing: Vec<&String> = modules
        .iter()
        .filter(|m| !layer_of.contains_key(m.as_str()))
        .collect();
    if !missing.is_empty() {
        bail!(
            "{}: modules not in the layer list (xtask/src/layers.rs): {missing:?}; place each in its layer",
            krate.src
        );
    }
    let gone: Vec<&&str> = layer_of.keys().filter(|m| !modules.contains(**m)).collect();
    if !gone.is_empty() {
        bail!(
            "{}: listed in xtask/src/layers.rs but not in the crate: {gone:?}",
            krate.src
        );
    }
    // A macro used where it is not defined comes from the lowest of the modules that define
    // it (the most the use can be sure of).
    let lowest: BTreeMap<String, String> = macros
        .iter()
        .filter_map(|(name, defs)| {
            let low = defs.iter().min_by_key(|m| layer_of[m.as_str()])?;
            Some((name.clone(), low.clone()))
        })
        .collect();
    let mut out = Vec::new();
    for (file, module, path, text) in &texts {
        let from = layer_of[module.as_str()];
        let code = without_comments(text);
        for (at, to, what) in uses(&code, &lowest, krate.prefix, path) {
            let own_macro = what.ends_with('!')
                && macros
                    .get(what.trim_end_matches('!'))
                    .is_some_and(|defs| defs.contains(module));
            if to == *module || own_macro {
                continue;
            }
            let in_loop =
                |a: &str, b: &str| krate.loops.iter().any(|l| l.contains(&a) && l.contains(&b));
            if let Some(&l) = layer_of.get(to.as_str())
                && (l > from || (l == from && !in_loop(module, &to)))
            {
                out.push(Violation {
                    file: file.strip_prefix(root).unwrap_or(file).to_path_buf(),
                    line: code[..at].matches('\n').count() + 1,
                    from: module.clone(),
                    to,
                    what,
                });
            }
        }
    }
    Ok(out)
}

/// `cargo xtask layers`, and the step of `cargo xtask test`.
pub fn run() -> Result<()> {
    step("imports run one way (xtask/src/layers.rs)");
    let mut bad = 0;
    for krate in [&SHIM, &SHIM_LEDGER, &SHIM_CUDA, &AGENT] {
        let v = check(&root(), krate)?;
        for x in &v {
            eprintln!(
                "{}:{}: {} uses {} ({}): an import that runs up the layers",
                x.file.display(),
                x.line,
                x.from,
                x.to,
                x.what
            );
        }
        bad += v.len();
        let widest = krate.layers.iter().map(|l| l.len()).max().unwrap_or(0);
        println!(
            "{}: {} modules in {} layers (the widest {widest}), {}",
            krate.src,
            krate.layers.iter().map(|l| l.len()).sum::<usize>(),
            krate.layers.len(),
            if v.is_empty() {
                "no import runs up".to_string()
            } else {
                format!("{} imports run up", v.len())
            }
        );
    }
    if bad > 0 {
        bail!("{bad} imports run up the layers: move the code down, or pass a callback up");
    }
    Ok(())
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("{}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The module path of a file under `src` (`gate/batch.rs` -> [gate, batch], `gate/mod.rs`
/// -> [gate]); empty for the root (`lib.rs`, `main.rs`, `mod.rs`), which sits above every
/// layer. Its first element is the top-level module the file belongs to.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let Ok(rel) = file.strip_prefix(src) else {
        return Vec::new();
    };
    let mut path: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|c| c.strip_suffix(".rs").unwrap_or(c).to_string())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    if path.len() == 1 && matches!(path[0].as_str(), "lib" | "main") {
        path.clear();
    }
    path
}

/// The macros a file defines with `macro_rules! NAME`.
fn macro_names(text: &str) -> Vec<String> {
    text.match_indices("macro_rules!")
        .filter_map(|(i, m)| {
            let rest = text[i + m.len()..].trim_start();
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// `text` with its `//` comments blanked (lines kept, so offsets still give line numbers).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules `code` (a file of module path `path`) uses, each with its byte offset and what
/// was seen: paths `PREFIX NAME` (also each item of a `use PREFIX{a::x, b}` group, over several
/// lines and nested braces), `super::` chains that climb to the folder's root (inline
/// `mod NAME { .. }` blocks, tests among them, counted as levels), and macros defined
/// elsewhere (`NAME!`).
fn uses(
    code: &str,
    macros: &BTreeMap<String, String>,
    prefix: &str,
    path: &[String],
) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let named = |at: usize, rest: &str, shown: &str, out: &mut Vec<(usize, String, String)>| {
        for name in first_segments(rest) {
            out.push((at, name.clone(), format!("{shown}{name}")));
        }
    };
    for (i, m) in code.match_indices(prefix) {
        if code[..i].ends_with("::") {
            continue; // `x::crate::..` is no path of ours
        }
        named(i, &code[i + m.len()..], prefix, &mut out);
    }
    let inline = inline_modules(code);
    for (i, _) in code.match_indices("super::") {
        if code[..i].ends_with("super::") {
            continue; // inside a chain: counted from its start
        }
        let mut k = 0;
        let mut rest = &code[i..];
        while let Some(r) = rest.strip_prefix("super::") {
            k += 1;
            rest = r;
        }
        let depth = path.len() + inline.iter().filter(|(a, b)| *a < i && i < *b).count();
        if k == depth {
            named(i, rest, &"super::".repeat(k), &mut out);
        }
    }
    for (name, module) in macros {
        let call = format!("{name}!");
        for (start, _) in code.match_indices(&call) {
            let before = code[..start].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !code[..start].trim_end().ends_with("macro_rules!")
            {
                out.push((start, module.clone(), call.clone()));
            }
        }
    }
    out
}

/// The first segment of a path (`x::y` -> x), or of each item of a `{a::x, b}` group at its
/// top level.
fn first_segments(rest: &str) -> Vec<String> {
    let Some(group) = rest.strip_prefix('{') else {
        let name = ident(rest);
        return if name.is_empty() { vec![] } else { vec![name] };
    };
    let mut out = Vec::new();
    let (mut depth, mut item_start) = (0usize, true);
    for (j, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && (c.is_alphanumeric() || c == '_') => {
                item_start = false;
                out.push(ident(&group[j..]));
            }
            _ => {}
        }
    }
    out
}

/// The byte ranges of inline `mod NAME { .. }` blocks in `code` (braces counted; good for
/// code whose string literals balance their braces, as format strings do).
fn inline_modules(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, m) in code.match_indices("mod ") {
        if code[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &code[i + m.len()..];
        let name = ident(rest.trim_start());
        let after = rest.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = code.len() - after.len();
        let mut depth = 0usize;
        for (j, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, open + j));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOY: Crate = Crate {
        src: "src",
        prefix: "crate::",
        layers: &[&["low"], &["mid_a", "mid_b", "mid_c"], &["high"]],
        loops: &[&["mid_a", "mid_b"]],
    };

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("xtask-layers-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join("src").join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn downward_and_in_group_imports_pass() {
        let dir = tree(&[
            (
                "lib.rs",
                "mod low; mod mid_a; mod mid_b; mod high; use crate::high::x;",
            ),
            ("low.rs", "macro_rules! shout { () => {} }\npub fn f() {}"),
            (
                "mid_a.rs",
                "use crate::{\n    low::{f, g},\n    mid_b,\n};\nfn g() { shout!(); }",
            ),
            (
                "mid_b/mod.rs",
                "use crate::mid_a::g; // crate::high in a comment",
            ),
            ("mid_b/inner.rs", "fn h() { crate::low::f(); }"),
            ("mid_c.rs", "use crate::low;"),
            ("high.rs", "use crate::mid_b;"),
        ]);
        assert_eq!(check(&dir, &TOY).unwrap(), vec![]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_upward_path_or_macro_is_found_with_its_line() {
        let dir = tree(&[
            ("low.rs", "pub fn f() {}\nfn g() { crate::mid_a::x(); }"),
            (
                "mid_a.rs",
                "use crate::{\n    low::{a, b},\n    high::y,\n};",
            ),
            ("mid_b.rs", "fn k() { loud!(); }"),
            ("mid_c.rs", "\nuse crate::mid_a;"),
            ("high.rs", "macro_rules! loud { () => {} }"),
        ]);
        let v = check(&dir, &TOY).unwrap();
        let got: Vec<(&str, usize, &str, &str)> = v
            .iter()
            .map(|x| {
                (
                    x.file.to_str().unwrap(),
                    x.line,
                    x.from.as_str(),
                    x.to.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("src/low.rs", 2, "low", "mid_a"),
                ("src/mid_a.rs", 1, "mid_a", "high"),
                ("src/mid_b.rs", 1, "mid_b", "high"),
                ("src/mid_c.rs", 2, "mid_c", "mid_a"),
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_module_missing_from_the_list_or_gone_fails() {
        let dir = tree(&[
            ("low.rs", ""),
            ("mid_a.rs", ""),
            ("mid_b.rs", ""),
            ("mid_c.rs", ""),
            ("high.rs", ""),
            ("extra.rs", ""),
        ]);
        let err = check(&dir, &TOY).unwrap_err().to_string();
        assert!(err.contains("\"extra\""), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        let dir = tree(&[
            ("low.rs", ""),
            ("mid_a.rs", ""),
            ("mid_c.rs", ""),
            ("high.rs", ""),
        ]);
        let err = check(&dir, &TOY).unwrap_err().to_string();
        assert!(err.contains("\"mid_b\""), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn super_paths_count_where_they_climb_to_the_folder() {
        const NESTED: Crate = Crate {
            src: "src/agent",
            prefix: "crate::agent::",
            layers: &[&["low"], &["high"]],
            loops: &[],
        };
        let dir = tree(&[
            ("agent/mod.rs", "mod low; mod high;"),
            // In a test block `super::` is the file's own module; two climb to the folder.
            (
                "agent/low.rs",
                "fn f() {}\nmod tests {\n    use super::f;\n    use super::super::high;\n}",
            ),
            // In a nested file, `super::` is its folder's module (high itself).
            ("agent/high/mod.rs", "mod part; use super::low;"),
            (
                "agent/high/part.rs",
                "use super::helper; use crate::agent::low::f;",
            ),
        ]);
        let v = check(&dir, &NESTED).unwrap();
        let got: Vec<(usize, &str, &str)> = v
            .iter()
            .map(|x| (x.line, x.from.as_str(), x.what.as_str()))
            .collect();
        assert_eq!(got, vec![(4, "low", "super::super::high")]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_agent_keeps_its_layers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let v = check(&root, &AGENT).unwrap();
        assert!(v.is_empty(), "{v:#?}");
    }

    #[test]
    fn the_shim_keeps_its_layers() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for krate in [&SHIM, &SHIM_LEDGER, &SHIM_CUDA] {
            let v = check(&root, krate).unwrap();
            assert!(v.is_empty(), "{}: {v:#?}", krate.src);
            assert!(
                krate.loops.is_empty(),
                "{}: the shim has no import loop",
                krate.src
            );
        }
    }
}
