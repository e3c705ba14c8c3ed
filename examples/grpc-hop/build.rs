//! Generates the `Relay` service from `proto/relay.proto` with protox (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/relay.proto");
    let descriptors = protox::compile(["proto/relay.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
