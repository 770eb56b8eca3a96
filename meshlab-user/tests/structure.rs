//! Structure checks over the source tree (docs/architecture.md): no two sibling modules import
//! each other (directly or around a longer circle), and no function is longer than
//! [`MAX_FN_LINES`]. Source-level scans, so they need no build of the code they check.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Longest function allowed, in lines from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 80;

/// Functions over the limit that other work owns right now, each with the reason; the test
/// fails when one of them is back under the limit so the entry gets removed.
const LONG_FN_EXCEPTIONS: &[(&str, &str)] = &[
    // Not split yet (issue 13 follow-up): two xtask VM drivers.
    ("xtask/src/vm/guest.rs", "run_guests"),
    ("xtask/src/vm_scenarios.rs", "check_nic_irq_recording"),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("meshlab-user is inside the workspace")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Source with comments and string/char literal contents blanked (line structure kept), so
/// braces and paths are only those of code.
fn code_only(src: &str) -> String {
    let bytes = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &src[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            out.extend(rest[..end].chars().filter(|&c| c == '\n'));
            i += end;
        } else if let Some(len) = raw_string_len(rest) {
            out.extend(rest[..len].chars().filter(|&c| c == '\n'));
            out.push_str("\"\"");
            i += len;
        } else if rest.starts_with('"') {
            let len = quoted_len(rest, '"');
            out.extend(rest[..len].chars().filter(|&c| c == '\n'));
            out.push_str("\"\"");
            i += len;
        } else if let Some(len) = char_literal_len(rest) {
            out.push_str("' '");
            i += len;
        } else {
            let c = rest.chars().next().expect("non-empty");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn raw_string_len(s: &str) -> Option<usize> {
    let after_r = s.strip_prefix("br").or_else(|| s.strip_prefix('r'))?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    Some(s.len() - body.len() + end + close.len())
}

fn quoted_len(s: &str, quote: char) -> usize {
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            '\\' if !escaped => escaped = true,
            c if c == quote && !escaped => return i + 1,
            _ => escaped = false,
        }
    }
    s.len()
}

/// `'x'`, `'\n'`, `'\u{..}'`; not lifetimes (`'a`).
fn char_literal_len(s: &str) -> Option<usize> {
    let mut chars = s.char_indices().skip(1);
    let (_, first) = chars.next()?;
    if first == '\\' {
        // Skip the escaped character itself: `'\''` ends at the second quote after it.
        let close = s.get(3..)?.find('\'')?;
        return Some(close + 4);
    }
    let (i, second) = chars.next()?;
    (second == '\'').then_some(i + 1)
}

/// Module path of a source file relative to its crate's `src/` (`lib.rs`/`main.rs` = root).
fn module_of(src_root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src_root).expect("file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("file name");
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_owned());
    }
    parts
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand_use(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or(tree).trim().to_owned()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.trim().is_empty())
        .flat_map(expand_use)
        .map(|p| match p.as_str() {
            "self" => prefix.to_owned(),
            _ => format!("{prefix}::{p}"),
        })
        .collect()
}

/// Every crate-relative path a file's non-test code refers to: `use` trees and inline
/// `crate::`/`super::` paths. A `#[cfg(test)]` module is cut off (its `super` is the file's
/// own module, and test code is no dependency of the product).
fn referenced_paths(code: &str) -> Vec<String> {
    let code = code.split("#[cfg(test)]\nmod ").next().unwrap_or(code);
    let mut paths = Vec::new();
    for statement in code.split(';') {
        // A `use` statement is the tail of the text since the previous `;`.
        let tail = statement.lines().map(str::trim_start).skip_while(|l| {
            !["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
                .iter()
                .any(|p| l.starts_with(p))
        });
        let text: String = tail.collect::<Vec<_>>().join(" ");
        if let Some(at) = text.find("use ") {
            paths.extend(expand_use(&text[at + 4..]));
        }
    }
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in code.match_indices(start) {
            if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
                continue;
            }
            let end = code[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| i + e);
            paths.push(code[i..end].trim_end_matches(':').to_owned());
        }
    }
    paths
}

/// Resolves a path written in module `from` to the module it names (longest known prefix).
fn resolve(from: &[String], path: &str, modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let mut segments = path.split("::").peekable();
    let mut base: Vec<String> = match *segments.peek()? {
        "crate" => {
            segments.next();
            Vec::new()
        }
        "super" | "self" => from.to_vec(),
        _ => return None, // external crate or a name in scope
    };
    while let Some(&s) = segments.peek() {
        match s {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segments.next();
    }
    let mut best = None;
    for s in segments {
        base.push(s.to_owned());
        if modules.contains(&base) {
            best = Some(base.clone());
        }
    }
    best
}

/// Edges between sibling modules: a reference from inside `a` to inside `b`, where `a` and `b`
/// are children of the same module.
fn sibling_edges(src_root: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src_root, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(src_root, f)).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let from = module_of(src_root, file);
        let code = code_only(&fs::read_to_string(file).expect("readable source"));
        for path in referenced_paths(&code) {
            let Some(to) = resolve(&from, &path, &modules) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                edges
                    .entry(from[..=common].to_vec())
                    .or_default()
                    .insert(to[..=common].to_vec());
            }
        }
    }
    edges
}

/// A circle through `start` in the edge graph, if any (depth-first search).
fn circle_through(
    start: &Vec<String>,
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Option<Vec<Vec<String>>> {
    let mut stack = vec![(start.clone(), vec![start.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((node, path)) = stack.pop() {
        for next in edges.get(&node).into_iter().flatten() {
            if next == start {
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}

fn crate_sources() -> Vec<PathBuf> {
    let ws = workspace();
    ["meshlab-user/src", "meshlab-common/src", "xtask/src"]
        .iter()
        .map(|d| ws.join(d))
        .collect()
}

#[test]
fn no_two_modules_import_each_other() {
    let mut circles = Vec::new();
    for src in crate_sources() {
        let edges = sibling_edges(&src);
        let mut reported = BTreeSet::new();
        for start in edges.keys() {
            if let Some(circle) = circle_through(start, &edges)
                && circle.iter().all(|m| reported.insert(m.clone()))
            {
                let names: Vec<String> = circle.iter().map(|m| m.join("::")).collect();
                circles.push(format!("{}: {}", src.display(), names.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn circles_are_found_by_the_scan() {
    let dir = std::env::temp_dir().join(format!("meshlab-structure-{}", std::process::id()));
    fs::create_dir_all(dir.join("m")).unwrap();
    fs::write(dir.join("lib.rs"), "mod m;").unwrap();
    fs::write(dir.join("m/mod.rs"), "mod a; mod b;").unwrap();
    fs::write(dir.join("m/a.rs"), "use super::b::{X, y::Z};").unwrap();
    fs::write(dir.join("m/b.rs"), "fn f() { crate::m::a::g(); }").unwrap();
    let edges = sibling_edges(&dir);
    let a = vec!["m".to_owned(), "a".to_owned()];
    let circle = circle_through(&a, &edges);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(circle.map(|c| c.len()), Some(2));
}

/// `(lines, file, line, name)` of every function body in `file`.
fn function_lengths(file: &Path) -> Vec<(usize, String, usize, String)> {
    let code = code_only(&fs::read_to_string(file).expect("readable source"));
    let lines: Vec<&str> = code.lines().collect();
    let shown = file
        .strip_prefix(workspace())
        .unwrap_or(file)
        .display()
        .to_string();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let (mut depth, mut opened) = (0i32, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            for c in l.chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if !opened && l.trim_end().ends_with(';') {
                break; // a declaration without a body
            }
            if opened && depth <= 0 {
                out.push((j - i + 1, shown.clone(), i + 1, name.clone()));
                break;
            }
        }
    }
    out
}

/// The name of a function whose signature starts on this line.
fn fn_name(line: &str) -> Option<String> {
    let at = line.find("fn ")?;
    let before = line[..at].trim();
    let qualifiers = [
        "pub",
        "pub(crate)",
        "pub(super)",
        "const",
        "async",
        "unsafe",
        "extern",
    ];
    if !before.split_whitespace().all(|w| qualifiers.contains(&w)) {
        return None;
    }
    let name: String = line[at + 3..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut files = Vec::new();
    for src in crate_sources() {
        rust_files(&src, &mut files);
    }
    let mut all: Vec<_> = files.iter().flat_map(|f| function_lengths(f)).collect();
    all.sort_by_key(|f| std::cmp::Reverse(f.0));
    // The longest ones, for the record (`-- --nocapture` shows them).
    for (len, file, line, name) in all.iter().take(8) {
        eprintln!("{len:4} lines  {file}:{line} {name}");
    }
    let excepted = |file: &str, name: &str| LONG_FN_EXCEPTIONS.contains(&(file, name));
    let too_long: Vec<String> = all
        .iter()
        .filter(|(len, file, _, name)| *len > MAX_FN_LINES && !excepted(file, name))
        .map(|(len, file, line, name)| format!("{file}:{line} {name}: {len} lines"))
        .collect();
    assert!(
        too_long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        too_long.join("\n")
    );
    for (file, name) in LONG_FN_EXCEPTIONS {
        let still_long = all
            .iter()
            .any(|(len, f, _, n)| f == file && n == name && *len > MAX_FN_LINES);
        assert!(
            still_long,
            "{file} {name} is short now: remove its exception"
        );
    }
}

#[test]
fn function_lengths_count_from_signature_to_closing_brace() {
    let dir = std::env::temp_dir().join(format!("meshlab-fnlen-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.rs");
    let src = "pub fn a(x: u8)\n    -> u8 {\n    let s = \"}\"; // }\n    x\n}\nfn b();\n";
    fs::write(&file, src).unwrap();
    let lengths = function_lengths(&file);
    fs::remove_dir_all(&dir).unwrap();
    let found: Vec<(usize, String)> = lengths.into_iter().map(|(l, _, _, n)| (l, n)).collect();
    assert_eq!(found, vec![(5, "a".to_owned())]);
}
