//! Compiles the .proto files with protox (a protobuf compiler in Rust: no protoc needed) and
//! generates the prost messages and tonic clients and servers from the descriptors.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/pluginregistration_v1.proto",
        "proto/deviceplugin_v1beta1.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
