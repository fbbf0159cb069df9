//! Builds the emulated kernels and finds the fatbin. See `kernels/README.md`.
//!
//! 1. Compiles every `kernels/*.cu` plus the emulator runtime (`kernels/emu/cuda_emu.cpp`) as
//!    C++20 with the system C++ compiler into a static library linked `+whole-archive`: its
//!    objects only register kernels through static constructors, and without the modifier
//!    the linker would drop them (see `docs/cuda-without-gpu.md`). Always at `-O2`: the
//!    emulator's speed is what the test suite waits on.
//! 2. If `cargo xtask kernels` has written the fatbin (`target/kernels/ember.fatbin` under the
//!    workspace, or the file `EMBER_KERNELS_FATBIN` names), sets `cfg(ember_fatbin)` and
//!    `EMBER_KERNELS_FATBIN_PATH` so that the crate embeds it. Without it the crate still
//!    builds; asking for the fatbin is then an error.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let root = manifest
        .parent()
        .and_then(Path::parent)
        .expect("crates/ember-kernels lies two levels below the workspace root")
        .to_path_buf();
    let kernels = root.join("kernels");

    let mut sources: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .expect("kernels/ exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    println!("cargo:rerun-if-changed={}", kernels.display());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .opt_level(2)
        .include(&kernels)
        .flag("-x")
        .flag("c++")
        .flag_if_supported("-Wno-unknown-pragmas")
        .flag_if_supported("-fno-exceptions")
        // Never fuse a * b + c into an FMA: kernels that must match the CPU bit for bit
        // (random.cu, arange) rely on separately rounded operations. (ISO C++ mode already
        // defaults to off; said explicitly so that no flag or -march change turns it on.)
        .flag("-ffp-contract=off")
        .link_lib_modifier("+whole-archive");
    if std::env::var_os("EMBER_KERNELS_ASAN").is_some_and(|v| v == "1") {
        // The sanitizer build (kernels/README.md, "Sanitizers"): the kernels and the emulator
        // runtime are instrumented and linked against GCC's libasan/libubsan; libasan must be
        // loaded first, so run with LD_PRELOAD=$(g++ -print-file-name=libasan.so).
        build
            .flag("-fsanitize=address,undefined")
            .flag("-fno-sanitize-recover=undefined")
            .flag("-fno-omit-frame-pointer");
        println!("cargo:rustc-link-lib=dylib=asan");
        println!("cargo:rustc-link-lib=dylib=ubsan");
        println!("cargo:rustc-cfg=ember_kernels_asan");
    }
    println!("cargo::rustc-check-cfg=cfg(ember_kernels_asan)");
    println!("cargo:rerun-if-env-changed=EMBER_KERNELS_ASAN");
    build
        .files(&sources)
        .file(kernels.join("emu").join("cuda_emu.cpp"));
    build.compile("ember_kernels_emu");

    // The fatbin, if built. The directory is watched (and created, so that watching it does
    // not rerun this script on every build) so that `cargo xtask kernels` triggers a rebuild.
    println!("cargo::rustc-check-cfg=cfg(ember_fatbin)");
    println!("cargo:rerun-if-env-changed=EMBER_KERNELS_FATBIN");
    let fatbin = match std::env::var_os("EMBER_KERNELS_FATBIN") {
        Some(path) => PathBuf::from(path),
        None => {
            let dir = root.join("target").join("kernels");
            let _ = std::fs::create_dir_all(&dir);
            println!("cargo:rerun-if-changed={}", dir.display());
            dir.join("ember.fatbin")
        }
    };
    // `cargo xtask kernels` writes the entry-point names beside the fatbin.
    let names = fatbin.with_extension("kernels");
    if fatbin.is_file() && names.is_file() {
        println!("cargo:rerun-if-changed={}", fatbin.display());
        println!("cargo:rerun-if-changed={}", names.display());
        println!("cargo:rustc-cfg=ember_fatbin");
        println!(
            "cargo:rustc-env=EMBER_KERNELS_FATBIN_PATH={}",
            fatbin.display()
        );
        println!(
            "cargo:rustc-env=EMBER_KERNELS_NAMES_PATH={}",
            names.display()
        );
    }
}
