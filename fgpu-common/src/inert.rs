//! Text a tenant chose, made inert for an operator's terminal and for text logs.
//!
//! Cgroup names (a container may create any name in its delegated subtree) and whatever a
//! tenant writes into its usage page reach the admin's terminal through `fgpu status`,
//! `fgpu top` and the agent's text log. A terminal obeys control characters: ESC starts
//! sequences that clear the screen, move the cursor or set the clipboard (OSC 52), CR
//! returns to the start of the line so that the rest overwrites what was printed, and
//! Unicode's bidirectional overrides and isolates reorder what is shown. [`escape`] (and
//! [`Inert`], its `Display` form) writes every such character as a visible escape, so the
//! bytes printed are printable text only and the name can still be read:
//!
//! | characters | written as |
//! |---|---|
//! | `\` | `\\` by [`escape`] (so an escape in its output always means an escaped character); kept by [`Escaping`] |
//! | C0 controls (incl. TAB, LF, CR, ESC), DEL | `\x09`, `\x0a`, `\x0d`, `\x1b`, `\x7f` |
//! | C1 controls (U+0080-U+009F) | `\u{9b}` |
//! | bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), the marks U+200E, U+200F, U+061C | `\u{202e}` |
//! | other invisible format characters (zero-width space and joiners, word joiner, BOM, soft hyphen, invisible operators, interlinear annotations, tag characters...) and the line and paragraph separators U+2028, U+2029 | `\u{200b}` |
//!
//! Everything else (letters of any script, `é`, CJK, emoji) is kept. JSON output does not
//! use this: serde escapes control characters its own way, and a JSON reader gets the name
//! as it is.

use std::borrow::Cow;
use std::fmt;

/// Whether `c` must not reach a terminal as it is: a control character, or an invisible
/// format character (see the module documentation).
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_invisible_format(c)
}

/// What [`escape`] writes as an escape: the [`is_unsafe`] characters and `\`.
fn needs_escape(c: char) -> bool {
    c == '\\' || is_unsafe(c)
}

/// Unicode format characters (general category Cf) and the line and paragraph separators:
/// they draw nothing, and several change how the text around them is shown.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{890}'..='\u{891}'
            | '\u{8e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}'
    )
}

/// `s` with every character [`needs_escape`] names written as a visible escape; `s` itself
/// (borrowed) when it has none.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(Inert(s).to_string())
}

/// `s`, escaped as [`escape`] does, when formatted with `{}`.
#[derive(Clone, Copy)]
pub struct Inert<'a>(pub &'a str);

impl fmt::Display for Inert<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(needs_escape) {
            f.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or_default();
            write_escaped(f, c)?;
            rest = &rest[i + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

impl fmt::Debug for Inert<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// A writer that passes on what is written through it with every [`is_unsafe`] character
/// escaped (`\\` is left as it is): for text whose pieces come from `Debug`
/// implementations not written here (a log field's value), which escape their own strings.
pub struct Escaping<W>(pub W);

impl<W: fmt::Write> fmt::Write for Escaping<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut rest = s;
        while let Some(i) = rest.find(is_unsafe) {
            self.0.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or_default();
            write_escaped(&mut self.0, c)?;
            rest = &rest[i + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

fn write_escaped(f: &mut impl fmt::Write, c: char) -> fmt::Result {
    match c {
        '\\' => f.write_str("\\\\"),
        '\0'..='\x7f' => write!(f, "\\x{:02x}", c as u32),
        _ => write!(f, "\\u{{{:x}}}", c as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_sequences_come_out_as_readable_escapes() {
        let evil = "/a\x1b[2J\x1b]52;c;aGk=\x07b\rc\nd\te\x7f\u{9b}f\\g";
        let out = escape(evil);
        assert_eq!(
            out,
            "/a\\x1b[2J\\x1b]52;c;aGk=\\x07b\\x0dc\\x0ad\\x09e\\x7f\\u{9b}f\\\\g"
        );
        assert!(out.chars().all(|c| (' '..='~').contains(&c)), "{out}");
    }

    #[test]
    fn bidi_and_invisible_characters_are_shown() {
        for c in ('\u{202a}'..='\u{202e}')
            .chain('\u{2066}'..='\u{2069}')
            .chain(['\u{200b}', '\u{200d}', '\u{200e}', '\u{feff}', '\u{e0041}'])
        {
            let text = format!("x{c}y");
            assert_eq!(escape(&text), format!("x\\u{{{:x}}}y", c as u32));
        }
        assert_eq!(escape("/pod-é/日本/🙂"), "/pod-é/日本/🙂");
        assert!(matches!(escape("/kubepods/x"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaping_writer_escapes_whatever_is_written_through_it() {
        use std::fmt::Write as _;
        let mut s = String::new();
        let (debugged, shown, backslash) = ("a\u{202e}b", "\r\u{2067}", "\\");
        write!(Escaping(&mut s), "{debugged:?} {shown} {backslash}").unwrap();
        assert_eq!(s, "\"a\\u{202e}b\" \\x0d\\u{2067} \\");
        assert_eq!(format!("{}", Inert("\x1b")), "\\x1b");
    }
}
