//! `msa info`: what this binary was built with, what the device probe sees, and what works
//! without a GPU.

use std::process::ExitCode;

pub fn run() -> ExitCode {
    let archs = msa_kernels::built_archs();
    println!("msa {}", env!("CARGO_PKG_VERSION"));
    println!(
        "feature msa: {}",
        if cfg!(feature = "msa") { "on" } else { "off" }
    );
    println!(
        "kernel architectures: {}",
        if archs.is_empty() {
            "none (built without `msa`)".to_string()
        } else {
            archs.join(", ")
        }
    );
    println!(
        "backend cpu: available (the CPU reference: `msa run --backend cpu`, and what \
         `--backend auto` uses without a GPU)"
    );
    let count = match msa_probe::device_count() {
        Ok(n) => n,
        Err(e) => {
            println!("devices: unavailable: {e}");
            if cfg!(not(feature = "msa")) {
                println!(
                    "to build the CUDA kernels: `cargo xtask build-kernels`, then build or run \
                     with `--features msa` (e.g. `cargo run --release -p msa-cli --features msa \
                     -- info`)"
                );
            }
            return ExitCode::SUCCESS;
        }
    };
    println!("devices: {count}");
    for ordinal in 0..count {
        match msa_probe::kernels_available(ordinal, archs) {
            Ok(d) => println!(
                "  [{ordinal}] {}: compute capability {}.{}, {} SMs, {} KiB shared memory per block (opt-in); kernels: {}",
                d.name,
                d.capability.0,
                d.capability.1,
                d.sm_count,
                d.max_shared_memory_per_block_optin / 1024,
                d.served_by
            ),
            Err(e) => {
                let name = msa_probe::device_name(ordinal).unwrap_or_else(|_| "?".into());
                println!("  [{ordinal}] {name}: kernels unavailable: {e}");
            }
        }
    }
    ExitCode::SUCCESS
}
