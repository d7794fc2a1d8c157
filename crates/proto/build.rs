//! Compiles `proto/ps.proto` with the vendored `protoc` (nothing is downloaded at build time).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free: build scripts are single-threaded; tonic-prost-build reads PROTOC.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::configure()
        .bytes(".")
        .compile_protos(&["proto/ps.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/ps.proto");
    Ok(())
}
