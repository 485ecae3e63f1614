//! A Dockerfile read into stages and instructions (continuation lines joined, comments
//! dropped), with the parts of `COPY`, `ENV`, `RUN cargo build` and `.dockerignore` the tests
//! check.

/// One build stage: `FROM base [AS name]` and its instructions.
#[derive(Debug)]
pub struct Stage {
    /// The image or stage it starts from.
    pub base: String,
    /// `AS name`, lower-cased.
    pub name: Option<String>,
    /// `(KEYWORD, arguments)`, keywords upper-cased.
    pub instructions: Vec<(String, String)>,
}

/// `COPY [--from=stage] sources... dest`.
#[derive(Debug)]
pub struct Copy {
    /// `--from`, when it copies from a stage or image.
    pub from: Option<String>,
    /// Source paths.
    pub sources: Vec<String>,
    /// Destination.
    pub dest: String,
}

/// Parses a Dockerfile's stages.
pub fn parse(text: &str) -> Result<Vec<Stage>, String> {
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical_lines(text) {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let (keyword, args) = (keyword.to_ascii_uppercase(), args.trim().to_owned());
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            let (base, name) = match words.as_slice() {
                [base] => (*base, None),
                [base, as_, name] if as_.eq_ignore_ascii_case("as") => (*base, Some(name.to_ascii_lowercase())),
                _ => return Err(format!("FROM {args}: expected `FROM image [AS name]`")),
            };
            stages.push(Stage { base: base.to_owned(), name, instructions: Vec::new() });
        } else if keyword == "ARG" && stages.is_empty() {
            continue;
        } else {
            let stage = stages.last_mut().ok_or_else(|| format!("{keyword} before the first FROM"))?;
            stage.instructions.push((keyword, args));
        }
    }
    if stages.is_empty() { Err("no FROM".into()) } else { Ok(stages) }
}

/// Physical lines joined at a trailing `\`, blank and comment lines dropped (also inside a
/// continued instruction, as Docker does).
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut current = String::new();
    for raw in text.lines() {
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                lines.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.trim().is_empty() {
        lines.push(current);
    }
    lines
}

impl Stage {
    /// The arguments of every instruction `keyword`.
    pub fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions.iter().filter(move |(k, _)| k == keyword).map(|(_, args)| args.as_str())
    }

    /// Every `COPY` of the stage.
    pub fn copies(&self) -> Result<Vec<Copy>, String> {
        self.all("COPY").map(copy).collect()
    }

    /// Every `ENV` variable the stage sets, in order.
    pub fn env(&self) -> Result<Vec<(String, String)>, String> {
        let mut vars = Vec::new();
        for args in self.all("ENV") {
            let words = shell_words(args)?;
            if words.len() == 2 && !words[0].contains('=') {
                vars.push((words[0].clone(), words[1].clone()));
                continue;
            }
            for word in words {
                let (key, value) =
                    word.split_once('=').ok_or_else(|| format!("ENV {args}: {word:?} is not KEY=VALUE"))?;
                vars.push((key.to_owned(), value.to_owned()));
            }
        }
        Ok(vars)
    }

    /// The last `USER`, if any.
    pub fn user(&self) -> Option<&str> {
        self.all("USER").last()
    }
}

fn copy(args: &str) -> Result<Copy, String> {
    let mut words = shell_words(args)?;
    let mut from = None;
    while words.first().is_some_and(|w| w.starts_with("--")) {
        let flag = words.remove(0);
        if let Some(stage) = flag.strip_prefix("--from=") {
            from = Some(stage.to_ascii_lowercase());
        }
    }
    if words.first().is_some_and(|w| w.starts_with('[')) {
        words = serde_json::from_str(&words.join(" ")).map_err(|e| format!("COPY {args}: {e}"))?;
    }
    let dest = words.pop().ok_or_else(|| format!("COPY {args}: no destination"))?;
    if words.is_empty() {
        return Err(format!("COPY {args}: no source"));
    }
    Ok(Copy { from, sources: words, dest })
}

/// Words split at unquoted whitespace, double quotes removed.
pub fn shell_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut in_word = false;
    for c in text.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if quoted {
        return Err(format!("unbalanced quote in {text:?}"));
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// The `--bin` and `--features` arguments of a `cargo build` in `run`, and whether it builds
/// `--release --locked`; `None` if `run` has no `cargo build`.
pub fn cargo_build(run: &str) -> Option<CargoBuild> {
    let start = run.find("cargo build")?;
    let command = run[start + "cargo build".len()..].split("&&").next().unwrap_or_default();
    let words: Vec<&str> = command.split_whitespace().collect();
    let mut build = CargoBuild::default();
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            "--release" => build.release = true,
            "--locked" => build.locked = true,
            "--bin" | "--features" | "-F" if i + 1 < words.len() => {
                let values = words[i + 1].split(',').map(str::to_owned);
                if words[i] == "--bin" {
                    build.bins.extend(values)
                } else {
                    build.features.extend(values)
                }
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    Some(build)
}

/// What one `cargo build` builds.
#[derive(Debug, Default)]
pub struct CargoBuild {
    /// `--release`.
    pub release: bool,
    /// `--locked`.
    pub locked: bool,
    /// Each `--bin`.
    pub bins: Vec<String>,
    /// Each `--features` entry.
    pub features: Vec<String>,
}

/// Whether `.dockerignore` (its lines) excludes `path` (relative to the context, `/`-separated):
/// the last matching pattern decides, `!` re-includes, a pattern matching a directory excludes
/// what is under it, `*` matches within a path segment and `**` any number of segments.
pub fn ignored(dockerignore: &str, path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    let mut excluded = false;
    for line in dockerignore.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (negated, pattern) = match line.strip_prefix('!') {
            Some(pattern) => (true, pattern),
            None => (false, line),
        };
        let pattern: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
        if (1..=segments.len()).any(|n| matches(&pattern, &segments[..n])) {
            excluded = !negated;
        }
    }
    excluded
}

fn matches(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => matches(&pattern[1..], path) || (!path.is_empty() && matches(pattern, &path[1..])),
        (Some(p), Some(s)) => segment_matches(p, s) && matches(&pattern[1..], &path[1..]),
        _ => false,
    }
}

fn segment_matches(pattern: &str, segment: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == segment,
        Some((prefix, rest)) => {
            segment.starts_with(prefix)
                && (0..=segment.len() - prefix.len()).any(|skip| {
                    segment.is_char_boundary(prefix.len() + skip)
                        && segment_matches(rest, &segment[prefix.len() + skip..])
                })
        }
    }
}

#[test]
fn dockerignore_patterns_match_like_docker() {
    let ignore = "# comment\n.git\n**/target\n**/*.swp\ndocs/*.md\n!docs/keep.md\n";
    for path in [".git", ".git/HEAD", "target", "target/release/x", "services/a/target/debug", "a/b.swp", "docs/x.md"] {
        assert!(ignored(ignore, path), "{path}");
    }
    for path in ["src/main.rs", "gitx", "docs/keep.md", "docs/sub/x.md", "targets/x"] {
        assert!(!ignored(ignore, path), "{path}");
    }
}

#[test]
fn a_dockerfile_reads_into_stages() {
    let text = "# syntax=docker/dockerfile:1\nARG V=1\nFROM rust:1 AS Build\nRUN cargo build --release \\\n  # a comment\n  --bin a --bin b \\\n  --features x/k,y/m --locked && cp a /out/\nFROM debian\nCOPY --from=build --chown=u /out/a /out/b /usr/local/bin/\nENV A=1 B=\"two words\"\nENV C 3\nUSER u:u\n";
    let stages = parse(text).unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!((stages[0].base.as_str(), stages[0].name.as_deref()), ("rust:1", Some("build")));
    let build = cargo_build(stages[0].all("RUN").next().unwrap()).unwrap();
    assert!(build.release && build.locked);
    assert_eq!((build.bins, build.features), (vec!["a".into(), "b".into()], vec!["x/k".into(), "y/m".into()]));
    let copies = stages[1].copies().unwrap();
    assert_eq!(copies[0].from.as_deref(), Some("build"));
    assert_eq!(
        (copies[0].sources.clone(), copies[0].dest.as_str()),
        (vec!["/out/a".into(), "/out/b".into()], "/usr/local/bin/")
    );
    let env: Vec<(String, String)> =
        [("A", "1"), ("B", "two words"), ("C", "3")].map(|(k, v)| (k.into(), v.into())).into();
    assert_eq!(stages[1].env().unwrap(), env);
    assert_eq!(stages[1].user(), Some("u:u"));
}
