//! Why the agent could not start.

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A port could not be opened.
    #[error("{0}")]
    Port(std::io::Error),
    /// A thread could not be started.
    #[error("cannot start thread: {0}")]
    Thread(std::io::Error),
    /// The `/metrics` listener could not start.
    #[error("metrics listener: {0}")]
    Metrics(telemark_transport::server::ServerError),
    /// The INT report socket could not be opened.
    #[error("int.report_to: {0}")]
    Report(std::io::Error),
}
