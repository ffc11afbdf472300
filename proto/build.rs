//! Compiles the API's .proto files with protox (a protobuf compiler written in Rust), so building
//! needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/gpu_agent/v1/agent.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
