//! Shell completions and man pages (`fgpu generate`, hidden; `cargo xtask dist-docs` and the
//! images run it): generated the way xtask does into a temporary folder, then checked against
//! what `fgpu --help` says the command line is. The completions are run, not only grepped:
//! bash's completion function, fish's `complete -C` and zsh's command lists are asked for
//! every subcommand and option; every man page is rendered with `man -l`. bash, zsh, fish and
//! man-db are needed (.ci/run installs them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fgpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fgpu"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// `fgpu PATH --help`.
fn help(path: &[String]) -> String {
    let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
    args.push("--help");
    stdout(&fgpu(&args), &format!("fgpu {} --help", path.join(" ")))
}

/// The lines of one section (`Commands:`, `Options:`) of a help text.
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect()
}

/// The subcommands `fgpu PATH --help` lists, without clap's own `help`.
fn subcommands(path: &[String]) -> Vec<String> {
    section(&help(path), "Commands:")
        .into_iter()
        // An entry starts two columns in; wrapped descriptions further.
        .filter(|l| l.starts_with("  ") && !l[2..].starts_with(' '))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .filter(|name| name != "help")
        .collect()
}

/// The long options `fgpu PATH --help` lists (`--memory`, ...).
fn long_options(path: &[String]) -> Vec<String> {
    section(&help(path), "Options:")
        .into_iter()
        .filter_map(|l| {
            l.split([' ', ',', '=', '['])
                .find(|w| w.starts_with("--"))
                .map(str::to_string)
        })
        .collect()
}

/// Every command path: `[]` (fgpu itself), `[agent]`, `[limit]`, `[limit, set]`, ...
fn tree() -> Vec<Vec<String>> {
    let mut all = vec![Vec::new()];
    let mut i = 0;
    while i < all.len() {
        let path = all[i].clone();
        for sub in subcommands(&path) {
            let mut child = path.clone();
            child.push(sub);
            all.push(child);
        }
        i += 1;
    }
    assert!(
        all.len() > 10 && all.iter().any(|p| p == &["limit", "set"]),
        "the help texts were not read: {all:?}"
    );
    all
}

/// A fresh folder filled the way `cargo xtask dist-docs` fills target/dist.
fn generated(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fgpu-completions-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let completions = dir.join("completions");
    let man = dir.join("man");
    for shell in ["bash", "zsh", "fish"] {
        let out = fgpu(&[
            "generate",
            "completions",
            shell,
            "--out",
            completions.to_str().unwrap(),
        ]);
        stdout(&out, shell);
    }
    stdout(
        &fgpu(&["generate", "man", "--out", man.to_str().unwrap()]),
        "man",
    );
    dir
}

fn tool(name: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is not installed (.ci/run installs it: apt-get install {name})"
    );
}

fn run(cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    stdout(&cmd.output().unwrap(), &what)
}

/// What bash's completion offers for `fgpu WORDS... CUR`.
fn bash_complete(script: &Path, words: &[String], cur: &str) -> BTreeSet<String> {
    let prev = words.last().map_or("fgpu", String::as_str);
    let mut all = vec!["fgpu".to_string()];
    all.extend(words.iter().cloned());
    all.push(cur.to_string());
    let quoted: Vec<String> = all.iter().map(|w| format!("'{w}'")).collect();
    let line = format!(
        "source '{}' && COMP_WORDS=({}) && COMP_CWORD={} && _fgpu fgpu '{cur}' '{prev}' \
         && printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        all.len() - 1,
    );
    run(Command::new("bash").args(["--norc", "-c", &line]))
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_registers_and_offers_every_subcommand_and_option() {
    tool("bash");
    let dir = generated("bash");
    let script = dir.join("completions/fgpu.bash");
    run(Command::new("bash").arg("-n").arg(&script));
    let registered = run(Command::new("bash").args([
        "--norc",
        "-c",
        &format!("source '{}' && complete -p fgpu", script.display()),
    ]));
    assert!(
        registered.contains("-F _fgpu") && registered.trim_end().ends_with(" fgpu"),
        "{registered}"
    );
    // The classic: `fgpu l<TAB>` is `limit`.
    assert_eq!(
        bash_complete(&script, &[], "l"),
        BTreeSet::from(["limit".to_string()])
    );
    for path in tree() {
        let offered = bash_complete(&script, &path, "");
        let words: BTreeSet<String> = offered
            .iter()
            .filter(|w| !w.starts_with('-') && *w != "help")
            .cloned()
            .collect();
        let subs = subcommands(&path);
        // Aliases (`limit rm`'s `clear`) are offered too; nothing else, and never the
        // hidden `generate` at the top.
        for sub in &subs {
            assert!(
                words.contains(sub),
                "fgpu {path:?} <TAB> lacks {sub}: {offered:?}"
            );
        }
        if path.is_empty() {
            assert_eq!(words, subs.iter().cloned().collect(), "fgpu <TAB>");
        }
        let options = bash_complete(&script, &path, "--");
        for option in long_options(&path) {
            assert!(
                options.contains(&option),
                "fgpu {path:?} --<TAB> lacks {option}: {options:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fish_completion_parses_and_offers_every_subcommand_and_option() {
    tool("fish");
    let dir = generated("fish");
    let script = dir.join("completions/fgpu.fish");
    run(Command::new("fish").arg("--no-execute").arg(&script));
    let complete = |line: String| -> BTreeSet<String> {
        let cmd = format!("source '{}'; complete -C '{line}'", script.display());
        run(Command::new("fish").args(["--no-config", "-c", &cmd]))
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_string())
            .collect()
    };
    for path in tree() {
        let prefix = ["fgpu".to_string()]
            .into_iter()
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let offered = complete(format!("{prefix} "));
        let subs = subcommands(&path);
        for sub in &subs {
            assert!(
                offered.contains(sub),
                "{prefix} <TAB> lacks {sub}: {offered:?}"
            );
        }
        if path.is_empty() {
            assert!(
                !offered.contains("generate"),
                "the hidden `generate` is offered"
            );
        }
        let options = complete(format!("{prefix} --"));
        for option in long_options(&path) {
            assert!(
                options.contains(&option),
                "{prefix} --<TAB> lacks {option}: {options:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn zsh_completion_parses_and_lists_every_subcommand() {
    tool("zsh");
    let dir = generated("zsh");
    let script = dir.join("completions/_fgpu");
    let text = std::fs::read_to_string(&script).unwrap();
    assert!(text.starts_with("#compdef fgpu\n"), "not a zsh completion");
    run(Command::new("zsh").arg("-n").arg(&script));
    for path in tree() {
        let subs = subcommands(&path);
        if subs.is_empty() {
            continue;
        }
        // The script's list of PATH's subcommands (`_fgpu__subcmd__limit_commands`), read
        // through a `_describe` that prints instead of completing.
        let function: String = path.iter().map(|p| format!("__subcmd__{p}")).collect();
        let line = format!(
            "compdef() {{ : }}; _describe() {{ shift 3; print -rl -- \"${{(@P)1}}\" }}; \
             source '{}'; _fgpu{function}_commands",
            script.display()
        );
        let listed: BTreeSet<String> = run(Command::new("zsh").args(["-f", "-c", &line]))
            .lines()
            .map(|l| l.split(':').next().unwrap().to_string())
            .filter(|name| name != "help")
            .collect();
        for sub in &subs {
            assert!(
                listed.contains(sub),
                "zsh: fgpu {path:?} lacks {sub}: {listed:?}"
            );
        }
        if path.is_empty() {
            assert_eq!(listed, subs.iter().cloned().collect(), "zsh: fgpu");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn man_pages_cover_every_subcommand_and_its_options_and_render() {
    tool("man");
    let dir = generated("man");
    let man = dir.join("man");
    let tree = tree();
    let expected: BTreeSet<String> = tree
        .iter()
        .map(|path| {
            let mut name = vec!["fgpu".to_string()];
            name.extend(path.iter().cloned());
            format!("{}.1", name.join("-"))
        })
        .collect();
    let written: BTreeSet<String> = std::fs::read_dir(&man)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    // One page per command, nested ones too; none for `help` or the hidden `generate`.
    assert_eq!(written, expected);
    for path in &tree {
        let mut name = vec!["fgpu".to_string()];
        name.extend(path.iter().cloned());
        let page = man.join(format!("{}.1", name.join("-")));
        let roff = std::fs::read_to_string(&page).unwrap();
        let title = format!(".TH {} 1 ", name.join("-").to_uppercase());
        assert!(
            roff.lines().any(|l| l.starts_with(&title)),
            "{}: no `{title}`",
            page.display()
        );
        let rendered = Command::new("man")
            .arg("--warnings")
            .arg("-l")
            .arg(&page)
            .env("MANWIDTH", "100")
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        let text = stdout(&rendered, &format!("man -l {}", page.display()));
        assert!(
            rendered.stderr.is_empty(),
            "{}: {}",
            page.display(),
            String::from_utf8_lossy(&rendered.stderr)
        );
        // Each option gets an entry of its own in OPTIONS.
        for option in long_options(path) {
            assert!(
                text.lines().any(|l| l.trim_start().starts_with('-')
                    && l.split([' ', ',', '=', '[']).any(|w| w == option)),
                "{}: no entry for {option}:\n{text}",
                page.display()
            );
        }
        for sub in subcommands(path) {
            assert!(
                text.contains(&format!("{}-{sub}(1)", name.join("-"))),
                "{}: does not point to {sub}'s page",
                page.display()
            );
        }
    }
    let set = std::fs::read_to_string(man.join("fgpu-limit-set.1")).unwrap();
    assert!(
        set.contains("\\-\\-memory"),
        "fgpu-limit-set.1 lacks --memory"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn completions_go_to_stdout_without_out_and_unknown_shells_are_refused() {
    let script = stdout(&fgpu(&["generate", "completions", "bash"]), "to stdout");
    assert!(script.starts_with("_fgpu() {") && script.contains("complete -F _fgpu"));
    let out = fgpu(&["generate", "completions", "tcsh"]);
    assert!(!out.status.success());
    // Hidden from the help, as from the completions.
    assert!(!help(&[]).contains("generate"));
}
