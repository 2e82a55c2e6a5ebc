//! The Iggy error codes a client sees, and the one place where replog's
//! internal errors become them.
//!
//! Every code is declared once in the `error_codes!` table below (variant,
//! number, meaning); the mapping of a malformed request ([`PayloadError`])
//! and of a refused operation ([`BackendError`]) to a code lives at the
//! bottom of this file and nowhere else. The numbers are the 0.11.0 SDK's
//! (`IggyError::from_code`); a number the SDK does not know becomes its
//! generic error, so inventing one would lose information, never gain it.

use crate::protocol::{Identifier, NameField, PayloadError};
use crate::session::BackendError;
use storage::BatchError;

macro_rules! error_codes {
    ($($variant:ident = $code:literal, $meaning:literal;)*) => {
        /// An Iggy error code, as carried in a reply's `status` field or in a
        /// result-section entry. Status 0 (success) is not an error code and
        /// has no variant.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $(
                #[doc = $meaning]
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every code, in table order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The number on the wire.
            pub const fn code(self) -> u32 {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The code for a number, if the table has it.
            pub const fn from_code(code: u32) -> Option<Self> {
                match code {
                    $($code => Some(ErrorCode::$variant),)*
                    _ => None,
                }
            }

            /// What the code means, in a few words.
            pub const fn meaning(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $meaning,)*
                }
            }
        }
    };
}

error_codes! {
    Error = 1, "unspecified server error";
    InvalidCommand = 3, "the command code is unknown";
    InvalidFormat = 4, "the request body is malformed";
    FeatureUnavailable = 5, "the command is known but not implemented";
    InvalidIdentifier = 6, "an identifier is malformed";
    StaleClient = 30, "the client's session is stale";
    Unauthenticated = 40, "the connection is not logged in";
    Unauthorized = 41, "the user may not do this";
    InvalidCredentials = 42, "wrong username or password";
    TransientNotCommitted = 57, "not committed yet; retry on this connection";
    TransientNotAccepted = 58, "not accepted now (no primary); retry";
    RequestAlreadyApplied = 59, "applied already; its answer is no longer known";
    StreamIdNotFound = 1009, "no stream with this id";
    StreamNameNotFound = 1010, "no stream with this name";
    StreamNameAlreadyExists = 1012, "a stream with this name exists";
    InvalidStreamName = 1013, "the stream name is invalid";
    TopicIdNotFound = 2010, "no topic with this id";
    TopicNameNotFound = 2011, "no topic with this name";
    TopicNameAlreadyExists = 2013, "a topic with this name exists";
    InvalidTopicName = 2014, "the topic name is invalid";
    InvalidPartitionsCount = 2019, "the partition count is invalid";
    PartitionNotFound = 3007, "no such partition";
    NoPartitions = 3008, "the topic has no partitions";
    ConsumerOffsetNotFound = 3021, "no stored consumer offset";
    CannotSaveMessagesToSegment = 4006, "the messages could not be saved (the disk is full)";
    InvalidMessagesCount = 4009, "the message count is invalid";
    TooBigMessagePayload = 4022, "a message payload is too big";
    EmptyMessagePayload = 4024, "a message payload is empty";
    InvalidMessagePayloadLength = 4025, "the message batch layout is invalid";
    InvalidMessageChecksum = 4027, "a message checksum does not match";
    InvalidMessageTimestampDelta = 4038, "a message timestamp delta is invalid";
    InvalidBatchChecksum = 4039, "the batch checksum does not match";
    UnsupportedOptionKey = 4041, "an option key is not supported";
    InvalidOptionValue = 4042, "an option value is invalid";
    ConsumerGroupIdNotFound = 5000, "no consumer group with this id";
    ConsumerGroupNameNotFound = 5003, "no consumer group with this name";
    ConsumerGroupNameAlreadyExists = 5004, "a consumer group with this name exists";
    InvalidConsumerGroupName = 5005, "the consumer group name is invalid";
    ConsumerGroupMemberNotFound = 5006, "the caller is not a member of the group";
    ConsumerGroupPartitionNotOwned = 5009, "the partition is not assigned to the caller";
    IncompatibleProtocolVersion = 14003, "the client's protocol version is not supported";
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?}: {})", self.code(), self, self.meaning())
    }
}

fn by_identifier(id: &Identifier, numeric: ErrorCode, named: ErrorCode) -> ErrorCode {
    match id {
        Identifier::Numeric(_) => numeric,
        Identifier::Name(_) => named,
    }
}

impl From<&PayloadError> for ErrorCode {
    fn from(error: &PayloadError) -> Self {
        use PayloadError as P;
        match error {
            P::UnknownCommand { .. } => Self::InvalidCommand,
            P::Truncated { .. }
            | P::TrailingBytes { .. }
            | P::InvalidUtf8 { .. }
            | P::UnknownKind { .. }
            | P::InvalidFlag { .. }
            | P::MetadataLengthMismatch { .. }
            | P::RequestChecksumMismatch { .. } => Self::InvalidFormat,
            P::InvalidIdentifier { .. } => Self::InvalidIdentifier,
            P::InvalidName { field, .. } => match field {
                NameField::Stream => Self::InvalidStreamName,
                NameField::Topic => Self::InvalidTopicName,
                NameField::ConsumerGroup => Self::InvalidConsumerGroupName,
                NameField::Login => Self::InvalidFormat,
            },
            P::InvalidOptions { .. } => Self::InvalidOptionValue,
            P::MessagesCountMismatch { .. } => Self::InvalidMessagesCount,
            P::Batch(batch) => match batch {
                BatchError::ZeroMessages | BatchError::CountMismatch { .. } => {
                    Self::InvalidMessagesCount
                }
                BatchError::MessageChecksum { .. } => Self::InvalidMessageChecksum,
                BatchError::BatchChecksum { .. } => Self::InvalidBatchChecksum,
                _ => Self::InvalidMessagePayloadLength,
            },
        }
    }
}

impl From<&BackendError> for ErrorCode {
    fn from(error: &BackendError) -> Self {
        use BackendError as B;
        match error {
            B::InvalidCredentials => Self::InvalidCredentials,
            B::Unauthorized => Self::Unauthorized,
            B::StreamNotFound(id) => {
                by_identifier(id, Self::StreamIdNotFound, Self::StreamNameNotFound)
            }
            B::TopicNotFound(id) => {
                by_identifier(id, Self::TopicIdNotFound, Self::TopicNameNotFound)
            }
            B::ConsumerGroupNotFound(id) => by_identifier(
                id,
                Self::ConsumerGroupIdNotFound,
                Self::ConsumerGroupNameNotFound,
            ),
            B::PartitionNotFound(_) => Self::PartitionNotFound,
            B::NoPartitions => Self::NoPartitions,
            B::StreamNameAlreadyExists(_) => Self::StreamNameAlreadyExists,
            B::TopicNameAlreadyExists(_) => Self::TopicNameAlreadyExists,
            B::ConsumerGroupNameAlreadyExists(_) => Self::ConsumerGroupNameAlreadyExists,
            B::InvalidPartitionsCount(_) => Self::InvalidPartitionsCount,
            B::InvalidMessagesCount(_) => Self::InvalidMessagesCount,
            B::NotGroupMember => Self::ConsumerGroupMemberNotFound,
            B::PartitionNotOwned(_) => Self::ConsumerGroupPartitionNotOwned,
            B::InvalidOption(_) => Self::InvalidOptionValue,
            B::UnsupportedOptionKey(_) => Self::UnsupportedOptionKey,
            B::NotCommitted | B::ReplayUnplaced { .. } => Self::TransientNotCommitted,
            B::NoPrimary | B::Busy | B::NotReady => Self::TransientNotAccepted,
            B::AlreadyApplied => Self::RequestAlreadyApplied,
            B::NoSpace(_) => Self::CannotSaveMessagesToSegment,
            B::Unsupported => Self::FeatureUnavailable,
            B::LocalFault(_) => Self::Error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_the_table_when_codes_are_listed_should_be_unique_and_round_trip() {
        let mut seen = std::collections::BTreeSet::new();
        for &code in ErrorCode::ALL {
            assert!(seen.insert(code.code()), "duplicate {code}");
            assert_eq!(ErrorCode::from_code(code.code()), Some(code));
        }
        assert_eq!(ErrorCode::from_code(0), None);
    }

    #[test]
    fn given_a_full_disk_or_a_busy_server_when_answered_should_use_iggys_codes() {
        let full = BackendError::NoSpace("g-3: no space left on device".into());
        assert_eq!(ErrorCode::from(&full).code(), 4006);
        assert_eq!(ErrorCode::from(&BackendError::Busy).code(), 58);
        assert_eq!(
            BackendError::Busy.class(),
            crate::session::ErrorClass::Transient
        );
    }

    #[test]
    fn given_every_code_when_the_sdk_reads_it_should_name_the_same_error() {
        // The SDK's own table is the oracle: a number it maps to a different
        // error (or to its generic fallback) would mislead the client.
        for &code in ErrorCode::ALL {
            let sdk = iggy::prelude::IggyError::from_code(code.code());
            assert_eq!(
                sdk.as_code(),
                code.code(),
                "{code} is read by the SDK as {sdk:?}"
            );
        }
    }
}
