//! The README's code compiles: every Rust block in it names the file of `examples/starter` it
//! shows (first line `// examples/starter/...`) and is that file's text, verbatim; the starter is
//! built and run outside the checkout by `scripts/new-crate-test.sh` (part of the test command).
//! Its first example comes within its first 80 lines.

use std::path::Path;

fn rust_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((n, l)) = lines.next() {
        if l.trim_start() == "```rust" {
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| l.trim_start() != "```")
                .collect();
            out.push((n + 1, body.join("\n")));
        }
    }
    out
}

#[test]
fn every_rust_block_of_the_readme_is_a_file_of_the_starter_verbatim() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let blocks = rust_blocks(&readme);
    assert!(!blocks.is_empty(), "the README shows no Rust");
    assert!(blocks[0].0 <= 80, "the first example starts at line {}", blocks[0].0);
    for (line, block) in blocks {
        let (first, rest) = block.split_once('\n').unwrap_or((&block, ""));
        let file = first
            .strip_prefix("// ")
            .filter(|f| f.starts_with("examples/starter/"))
            .unwrap_or_else(|| panic!("README line {line}: a Rust block must begin `// examples/starter/<file>`"));
        let text =
            std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("README line {line}: {file}: {e}"));
        // Whole lines of the file, from a line's start to a line's end.
        let (hay, needle) = (format!("\n{text}\n"), format!("\n{}\n", rest.trim_matches('\n')));
        assert!(
            hay.contains(&needle),
            "README line {line}: the block is not whole lines of {file} verbatim (edit the file and copy it, or the README)"
        );
    }
}
