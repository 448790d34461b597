//! The `esper-ecs` command line.

use clap::Parser;

/// Vectorized morphogenetic training: many small host networks train side by side, one per environment,
/// while a policy grows, blends, keeps or prunes seed modules in fixed slots once per host epoch.
///
/// Every stage of an epoch runs as one batched operation over all environments, scheduled by bevy_ecs.
/// The seed lifecycle (stages, gates, alpha ramps, action masks) is implemented; host training,
/// `train`, `replay`, `profile` and `bench` arrive with the next milestones.
#[derive(Parser, Debug)]
#[command(name = "esper-ecs", version, about, long_about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    // No subcommands exist yet: show what the program is rather than doing nothing silently.
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.print_long_help().expect("stdout is writable");
    println!();
}
