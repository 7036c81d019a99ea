//! The command line's side: talking to the agent and printing what it says.

pub mod client;
pub mod doctor;
pub mod generate;
pub mod limit;
pub mod run;
pub mod status;
pub mod top;
