//! Integration tests of fenced-client.
