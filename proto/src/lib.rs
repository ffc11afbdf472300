//! Generated gRPC types and service stubs of `gpu_agent.v1`. Only the RPC layers of `agent` and
//! `ctl` use these; the domain converts at the edge.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub mod v1 {
    tonic::include_proto!("gpu_agent.v1");
}
