//! Tidy checks over the workspace's own source, run by `cargo test` (tigerbeetle's `tidy.zig`,
//! rust-analyzer's tidy tests): rules that a reviewer would otherwise have to remember.
//!
//! - Product code (`hub/src`, `node/src`, `shared/src`, outside test modules) has no `unwrap()`
//!   and no `expect(`, unless the line carries `tidy: allow(unwrap) <reason>`.
//! - No unfinished-work marker (the four-letter one) anywhere in the source, the schema or the
//!   docs; unfinished behaviour is asserted as it is today with a FIXME, or it is done.
//! - Every constant in a `limits` module is documented; integer limits are named with their
//!   qualifier last (time limits are `Duration`s, which carry their unit).
//! - `docs/ARCHITECTURE.md` names every module of the hub, the node and the shared crate, and
//!   every repository path it names (a backticked `hub/…`, `tests/…`, … without placeholders)
//!   exists.
//! - Migrations in `schema/hub`, `schema/node` and `schema/spool` are numbered from 0001 without gaps.
//! - The hub's record is reached only through `Store` (`hub/src/store/handle.rs`): the HTTP
//!   handlers, the CLI, the server and its background tasks, the status page, the metrics and
//!   the TLS layer name no `rusqlite`, no connection, writer or reader pool, and no transaction.
//! - Every difference between SQLite and PostgreSQL lives in the store's engine
//!   (`hub/src/store/engine/`): no other store file names `rusqlite`, and none asks which
//!   backend it runs on outside its tests (`Db::dialect`, `Dialect::`).

use std::path::{Path, PathBuf};

/// The workspace root (this crate lives in `shared/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn product_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for krate in ["hub", "node", "shared"] {
        rust_files(&root().join(krate).join("src"), &mut out);
    }
    out.sort();
    out
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// The part of a source file that is product code: everything before its first test module.
/// A file that is itself a test module (`tests.rs`, `*/tests/*.rs`) has none.
fn product_part(path: &Path, text: &str) -> String {
    if path.file_name().is_some_and(|n| n == "tests.rs") || path.components().any(|c| c.as_os_str() == "tests") {
        return String::new();
    }
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text.to_string(),
    }
}

#[test]
fn no_unwrap_or_expect_in_product_code() {
    let mut found = Vec::new();
    for p in product_files() {
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, line) in product_part(&p, &text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if (code.contains(".unwrap()") || code.contains(".expect(")) && !line.contains("tidy: allow(unwrap)") {
                found.push(format!("{}:{}: {}", rel(&p), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "unwrap()/expect( in product code (return an error instead):\n{}", found.join("\n"));
}

#[test]
fn no_todo_anywhere() {
    let mut files = Vec::new();
    for dir in ["hub", "node", "shared", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    for dir in ["schema/hub", "schema/node", "schema/spool", "docs"] {
        if let Ok(entries) = std::fs::read_dir(root().join(dir)) {
            files.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_file()));
        }
    }
    files.push(root().join("README.md"));
    let needle = ["TO", "DO"].concat();
    let mut found = Vec::new();
    for p in files {
        let Ok(text) = std::fs::read_to_string(&p) else { continue };
        for (i, line) in text.lines().enumerate() {
            if line.contains(&needle) || line.contains(&format!("{}!(", needle.to_lowercase())) {
                found.push(format!("{}:{}: {}", rel(&p), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "unfinished-work markers found:\n{}", found.join("\n"));
}

/// Suffixes a limit's name may end with: the unit or the qualifier comes last (STYLE habit 5).
const LIMIT_SUFFIXES: [&str; 7] = ["_MAX", "_MIN", "_DEFAULT", "_RANGE", "_MARGIN", "_PACE", "_GRACE"];

#[test]
fn limits_are_documented_and_named() {
    let mut found = Vec::new();
    for p in product_files().into_iter().filter(|p| p.file_name().is_some_and(|n| n == "limits.rs")) {
        let text = std::fs::read_to_string(&p).unwrap();
        let product = product_part(&p, &text);
        let lines: Vec<&str> = product.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let Some(rest) = t.strip_prefix("pub const ").or_else(|| t.strip_prefix("pub(crate) const ")) else {
                continue;
            };
            let name = rest.split(':').next().unwrap_or("").trim();
            let is_duration = rest.contains("Duration");
            let documented = i > 0 && lines[i - 1].trim_start().starts_with("///");
            if !documented {
                found.push(format!("{}:{}: {name} has no doc comment", rel(&p), i + 1));
            }
            if !is_duration && !LIMIT_SUFFIXES.iter().any(|s| name.ends_with(s)) {
                found.push(format!("{}:{}: {name} does not end with one of {LIMIT_SUFFIXES:?}", rel(&p), i + 1));
            }
        }
    }
    assert!(found.is_empty(), "limits must be named and documented:\n{}", found.join("\n"));
}

#[test]
fn architecture_names_every_module() {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for p in product_files() {
        let stem = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        if matches!(stem, "lib" | "main" | "mod" | "tests") {
            continue;
        }
        if !doc.contains(&format!("`{stem}`"))
            && !doc.contains(&format!("{stem}/"))
            && !doc.contains(&format!("{stem},"))
        {
            missing.push(rel(&p));
        }
    }
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md does not name these modules:\n{}", missing.join("\n"));
}

/// The folders a repository path in the codemap starts with.
const REPOSITORY_FOLDERS: &[&str] = &["hub/", "node/", "shared/", "schema/", "tests/", "docs/", ".ci/", ".cargo/"];

/// The repository paths `text` names in backticks: a span without spaces that starts with one
/// of `REPOSITORY_FOLDERS`, with no placeholder in it (`*`, `<`, `{`, `…`, `$`), cut at `::`
/// (a path followed by an item) and stripped of closing punctuation.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.split("::").next().unwrap_or("").trim_end_matches(['.', ',', ';', ':']).to_string())
        .filter(|p| !p.contains(char::is_whitespace) && REPOSITORY_FOLDERS.iter().any(|f| p.starts_with(f)))
        .filter(|p| !p.contains(['*', '<', '>', '{', '}', '…', '$']))
        .collect()
}

#[test]
fn architecture_names_only_paths_that_exist() {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let named = named_paths(&doc);
    assert!(named.len() > 20, "the codemap names too few paths to be a codemap: {named:?}");
    let missing: Vec<&String> = named.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md names paths that do not exist: {missing:?}");
}

#[test]
fn named_paths_are_the_backticked_repository_paths() {
    let text = "see `hub/src/lib.rs`, `tests/it/main.rs::harness` and `docs/`; not `cargo test`, \
                `hub/src/*.rs`, `node/<x>` or `Store`";
    assert_eq!(named_paths(text), ["hub/src/lib.rs", "tests/it/main.rs", "docs/"]);
}

/// The hub's files that must reach the record through `Store` only: every file under these
/// folders, and these files.
const STORE_CALLER_DIRS: &[&str] = &["hub/src/http", "hub/src/cli", "hub/src/runtime", "hub/src/tls"];
/// See `STORE_CALLER_DIRS`.
const STORE_CALLER_FILES: &[&str] = &[
    "hub/src/server.rs",
    "hub/src/housekeeping.rs",
    "hub/src/status_page.rs",
    "hub/src/metrics.rs",
    "hub/src/ops_listener.rs",
];
/// What such a file may not name: the SQLite crate, the backend's own handles, a transaction
/// run by hand, or a way to open the file around `Store`.
const STORE_BYPASSES: &[&str] = &[
    "rusqlite",
    "writer.call",
    "readers.read",
    "Writer::start",
    "Readers::new",
    "in_write_txn",
    "store::open_write",
    "store::open_read",
    "store::open_serve",
    "BEGIN IMMEDIATE",
];

#[test]
fn the_record_is_reached_only_through_the_store() {
    let mut files: Vec<PathBuf> = STORE_CALLER_FILES.iter().map(|f| root().join(f)).collect();
    for dir in STORE_CALLER_DIRS {
        rust_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > STORE_CALLER_FILES.len(), "the HTTP and CLI folders were found");
    let mut found = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", rel(&p)));
        for (i, line) in product_part(&p, &text).lines().enumerate() {
            for bypass in STORE_BYPASSES.iter().filter(|b| line.contains(**b)) {
                found.push(format!("{}:{}: names {bypass:?}: {}", rel(&p), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the record is reached around `Store` (add an operation to it instead):\n{}",
        found.join("\n")
    );
}

/// The store's engine: the one folder of the hub's source that may name SQLite's crate, and
/// the one folder of the store that may ask which backend it runs on.
const STORE_ENGINE_DIR: &str = "hub/src/store/engine";

#[test]
fn backend_differences_live_in_the_store_engine() {
    let mut files = Vec::new();
    rust_files(&root().join("hub/src"), &mut files);
    let engine = root().join(STORE_ENGINE_DIR);
    let store = root().join("hub/src/store");
    let files: Vec<PathBuf> = files.into_iter().filter(|p| !p.starts_with(&engine)).collect();
    assert!(files.iter().filter(|p| p.starts_with(&store)).count() > 20, "the store's files were found");
    let mut found = Vec::new();
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", rel(&p)));
        // Anywhere in the hub's source, tests included: SQLite is reached through the engine.
        for (i, line) in text.lines().enumerate() {
            if line.contains("rusqlite") {
                found.push(format!("{}:{}: names rusqlite: {}", rel(&p), i + 1, line.trim()));
            }
        }
        if !p.starts_with(&store) {
            continue;
        }
        for (i, line) in product_part(&p, &text).lines().enumerate() {
            if line.contains(".dialect()") || line.contains("Dialect::") {
                found.push(format!("{}:{}: asks for the backend: {}", rel(&p), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a backend difference outside the store's engine (a statement that must differ is a pair in \
         hub/src/store/engine/dialect.rs; SQLite itself is reached through the engine):\n{}",
        found.join("\n")
    );
}

#[test]
fn migrations_are_numbered_without_gaps() {
    for store in ["hub", "node", "postgres", "spool"] {
        let mut numbers: Vec<u32> = std::fs::read_dir(root().join("schema").join(store))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.get(..4)).and_then(|n| n.parse().ok()))
            .collect();
        numbers.sort_unstable();
        let expected: Vec<u32> = (1..=numbers.len() as u32).collect();
        assert_eq!(numbers, expected, "schema/{store} migrations must be numbered 0001.. without gaps");
    }
}
