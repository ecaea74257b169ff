//! `ivory completions SHELL`: a completion script for each shell clap_complete supports here.

use crate::cli_util::ivory;

#[tokio::test]
async fn completion_scripts_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F _ivory"),
        ("zsh", "#compdef ivory"),
        ("fish", "complete -c ivory"),
    ] {
        let run = ivory(["completions", shell]).await;
        assert_eq!(run.code, 0, "{shell}: {}", run.stderr);
        assert!(run.stdout.contains(marker), "{shell}: {}", run.stdout);
        // Subcommands and their flags are completed.
        assert!(
            run.stdout.contains("allow-insecure-registry"),
            "{shell}: {}",
            run.stdout
        );
    }
    let run = ivory(["completions", "tcsh"]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
}
