//! The binary's command line: its options with their defaults and environment variables, and
//! the values it refuses before connecting to anything.

use std::process::{Command, Output};

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_imagepipe-stage-rendition"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs")
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn help_names_every_option_with_its_variable() {
    let help = run(&["--help"], &[]);
    assert!(help.status.success(), "{}", text(&help));
    let help = text(&help);
    for (option, variable) in [
        ("--config", "IMAGEPIPE_CONFIG"),
        ("--stage", "IMAGEPIPE_RENDITION_STAGE"),
        ("--max-side", "IMAGEPIPE_RENDITION_MAX_SIDE"),
        ("--text", "IMAGEPIPE_RENDITION_TEXT"),
        ("--format", "IMAGEPIPE_RENDITION_FORMAT"),
        ("--quality", "IMAGEPIPE_RENDITION_QUALITY"),
        ("--max-pixels", "IMAGEPIPE_RENDITION_MAX_PIXELS"),
    ] {
        assert!(help.contains(option) && help.contains(variable), "{option} ({variable}) in:\n{help}");
    }
    let version = run(&["--version"], &[]);
    assert!(text(&version).starts_with("imagepipe-stage-rendition "), "{}", text(&version));
}

#[test]
fn values_out_of_range_and_names_that_cannot_be_stages_are_refused_at_once() {
    for args in [&["--max-side", "8"][..], &["--quality", "0"], &["--format", "gif"]] {
        let refused = run(args, &[]);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {}", text(&refused));
    }
    let refused = run(&[], &[("IMAGEPIPE_RENDITION_MAX_SIDE", "9000")]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    for stage in ["download", "Rendition", "a.b"] {
        let refused = run(&["--stage", stage], &[]);
        assert_eq!(refused.status.code(), Some(1), "{stage}: {}", text(&refused));
        assert!(text(&refused).contains("--stage"), "{stage}: {}", text(&refused));
    }
}
