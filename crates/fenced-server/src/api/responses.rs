//! The error answers many routes share, each described once for the OpenAPI document:
//! a route lists the type (`responses(..., NotLeader)`) in place of the same
//! `(status, description, body = ErrorBody)` line written again. Only the document
//! reads them; no handler builds one.
#![allow(dead_code)]

use utoipa::IntoResponses;

use super::error::ErrorBody;

/// 400: a query string the route does not take.
#[derive(IntoResponses)]
#[response(status = 400, description = "invalid_query")]
pub struct InvalidQuery(ErrorBody);

/// 413: a body over its bound.
#[derive(IntoResponses)]
#[response(status = 413, description = "too_large")]
pub struct TooLarge(ErrorBody);

/// 503 of a call the leader answers, which a member shutting down refuses too.
#[derive(IntoResponses)]
#[response(status = 503, description = "not_leader, shutting_down")]
pub struct NotLeaderOrShuttingDown(ErrorBody);

/// 503 of a call the leader answers, and the leader's id when this member knows it.
#[derive(IntoResponses)]
#[response(status = 503, description = "not_leader (with leader_id when known)")]
pub struct NotLeaderKnown(ErrorBody);

/// 503 of an administrator's call only the leader answers.
#[derive(IntoResponses)]
#[response(status = 503, description = "not_leader")]
pub struct NotLeader(ErrorBody);

/// 503 of an acquire: also while a new leader waits out the old one's leases.
#[derive(IntoResponses)]
#[response(status = 503, description = "recovering (with retry_after_ms), not_leader, shutting_down")]
pub struct RecoveringOrNotLeader(ErrorBody);

/// 409 of a change of the members.
#[derive(IntoResponses)]
#[response(status = 409, description = "membership_change_failed")]
pub struct MembershipChangeFailed(ErrorBody);
