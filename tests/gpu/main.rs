//! The GPU suite: every kernel against the host planner or the CPU reference, on real cases
//! and edge cases. One binary (the GPU bundle carries it); run with `--test-threads=1`.
//! Results go to stdout and, when `MSA_GPU_RESULTS` names a folder, to JSON lines there.

mod attention;
mod bench;
mod graph;
mod harness;
mod indexer;
mod kl;
mod pre_post;
mod prepare;
mod real_cases;
mod reference;
mod task_build;
