//! The command codes of the 0.11.0 protocol and how each travels
//! (client_protocol.md §3), declared once in the `commands!` table: the
//! code, its name, the operation byte it is sent with, whether it needs a
//! logged-in connection, and whether replog implements it.
//!
//! A request names its command by the header's operation byte: Register
//! (1) is a login, Logout (3) a logout, NonReplicated (2) carries the code
//! at header offset 196, and every other operation *is* the command (its
//! code is not on the wire). [`CommandCode::from_request`] is that rule.

/// Operation byte of a login.
pub const OPERATION_REGISTER: u8 = consensus::header::OPERATION_REGISTER;
/// Operation byte of a request whose code rides at header offset 196.
pub const OPERATION_NON_REPLICATED: u8 = consensus::header::OPERATION_NON_REPLICATED;
/// Operation byte of a logout.
pub const OPERATION_LOGOUT: u8 = 3;

/// Whether a reply to `operation` starts with a result section
/// (client_protocol.md §2.5): metadata operations (internal 64..=68 and
/// 128..=149) and the two consumer-offset writes. A Register reply is
/// result-framed when its body is non-empty, which the reply encoder
/// handles separately. DeleteSegments (138) is the exception the notes
/// miss: the SDK does not count it as a metadata operation, so its reply
/// is bare (checked against the SDK's `is_result_framed` in the tests).
pub const fn result_framed(operation: u8) -> bool {
    matches!(operation, 64..=68 | 128..=137 | 139..=149 | 161 | 162)
}

/// Whether the SDK accepts `operation` in a reply header (anything else
/// fails its decode with InvalidCommand).
pub const fn operation_known(operation: u8) -> bool {
    matches!(operation, 1..=3 | 64..=68 | 128..=149 | 160..=162)
}

macro_rules! commands {
    ($($variant:ident = $code:literal, $name:literal, op $op:literal, $auth:ident, $implemented:ident;)*) => {
        /// A command of the 0.11.0 protocol.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum CommandCode {
            $(
                #[doc = $name]
                $variant,
            )*
        }

        impl CommandCode {
            /// Every command, in table order.
            pub const ALL: &'static [CommandCode] = &[$(CommandCode::$variant,)*];

            /// The command code.
            pub const fn code(self) -> u32 {
                match self { $(Self::$variant => $code,)* }
            }

            /// The protocol's name for it.
            pub const fn name(self) -> &'static str {
                match self { $(Self::$variant => $name,)* }
            }

            /// The operation byte the 0.11.0 SDK sends it with.
            pub const fn operation(self) -> u8 {
                match self { $(Self::$variant => $op,)* }
            }

            /// Whether the connection must be logged in first.
            pub const fn requires_login(self) -> bool {
                match self { $(Self::$variant => commands!(@bool $auth),)* }
            }

            /// Whether replog implements it (otherwise: FeatureUnavailable).
            pub const fn implemented(self) -> bool {
                match self { $(Self::$variant => commands!(@bool $implemented),)* }
            }

            /// The command for a code, if the protocol has one.
            pub const fn from_code(code: u32) -> Option<Self> {
                match code { $($code => Some(Self::$variant),)* _ => None }
            }
        }
    };
    (@bool auth) => { true };
    (@bool open) => { false };
    (@bool yes) => { true };
    (@bool no) => { false };
}

commands! {
    Ping = 1, "PING", op 2, open, yes;
    GetStats = 10, "GET_STATS", op 2, auth, no;
    GetSnapshot = 11, "GET_SNAPSHOT_FILE", op 2, auth, no;
    GetClusterMetadata = 12, "GET_CLUSTER_METADATA", op 2, open, yes;
    DescribeOptions = 13, "DESCRIBE_OPTIONS", op 2, auth, no;
    AttachConsumerSession = 14, "ATTACH_CONSUMER_SESSION", op 2, auth, no;
    GetMe = 20, "GET_ME", op 2, auth, yes;
    GetClient = 21, "GET_CLIENT", op 2, auth, no;
    GetClients = 22, "GET_CLIENTS", op 2, auth, no;
    GetUser = 31, "GET_USER", op 2, auth, no;
    GetUsers = 32, "GET_USERS", op 2, auth, no;
    CreateUser = 33, "CREATE_USER", op 141, auth, no;
    DeleteUser = 34, "DELETE_USER", op 143, auth, no;
    UpdateUser = 35, "UPDATE_USER", op 142, auth, no;
    UpdatePermissions = 36, "UPDATE_PERMISSIONS", op 145, auth, no;
    ChangePassword = 37, "CHANGE_PASSWORD", op 144, auth, no;
    LoginUser = 38, "LOGIN_USER (legacy)", op 2, auth, no;
    LogoutUser = 39, "LOGOUT_USER", op 3, auth, yes;
    LoginRegister = 40, "LOGIN_REGISTER", op 1, open, yes;
    GetPersonalAccessTokens = 41, "GET_PERSONAL_ACCESS_TOKENS", op 2, auth, no;
    CreatePersonalAccessToken = 42, "CREATE_PERSONAL_ACCESS_TOKEN", op 146, auth, no;
    DeletePersonalAccessToken = 43, "DELETE_PERSONAL_ACCESS_TOKEN", op 147, auth, no;
    LoginWithPersonalAccessToken = 44, "LOGIN_WITH_PERSONAL_ACCESS_TOKEN (legacy)", op 2, auth, no;
    PollMessages = 100, "POLL_MESSAGES", op 2, auth, yes;
    SendMessages = 101, "SEND_MESSAGES", op 160, auth, yes;
    FlushUnsavedBuffer = 102, "FLUSH_UNSAVED_BUFFER", op 2, auth, yes;
    GetPollRouting = 103, "GET_POLL_ROUTING", op 2, auth, no;
    PollMessagesOnPrimary = 104, "POLL_MESSAGES_ON_PRIMARY", op 2, auth, no;
    GetConsumerOffset = 120, "GET_CONSUMER_OFFSET", op 2, auth, yes;
    StoreConsumerOffset = 121, "STORE_CONSUMER_OFFSET", op 161, auth, yes;
    DeleteConsumerOffset = 122, "DELETE_CONSUMER_OFFSET", op 162, auth, yes;
    GetConsumerOffsetRouting = 123, "GET_CONSUMER_OFFSET_ROUTING", op 2, auth, no;
    GetStream = 200, "GET_STREAM", op 2, auth, yes;
    GetStreams = 201, "GET_STREAMS", op 2, auth, yes;
    CreateStream = 202, "CREATE_STREAM", op 128, auth, yes;
    DeleteStream = 203, "DELETE_STREAM", op 130, auth, yes;
    UpdateStream = 204, "UPDATE_STREAM", op 129, auth, yes;
    PurgeStream = 205, "PURGE_STREAM", op 131, auth, yes;
    GetTopic = 300, "GET_TOPIC", op 2, auth, yes;
    GetTopics = 301, "GET_TOPICS", op 2, auth, yes;
    CreateTopic = 302, "CREATE_TOPIC", op 132, auth, yes;
    DeleteTopic = 303, "DELETE_TOPIC", op 134, auth, yes;
    UpdateTopic = 304, "UPDATE_TOPIC", op 133, auth, yes;
    PurgeTopic = 305, "PURGE_TOPIC", op 135, auth, yes;
    CreatePartitions = 402, "CREATE_PARTITIONS", op 136, auth, yes;
    DeletePartitions = 403, "DELETE_PARTITIONS", op 137, auth, yes;
    DeleteSegments = 503, "DELETE_SEGMENTS", op 138, auth, no;
    GetConsumerGroup = 600, "GET_CONSUMER_GROUP", op 2, auth, yes;
    GetConsumerGroups = 601, "GET_CONSUMER_GROUPS", op 2, auth, yes;
    CreateConsumerGroup = 602, "CREATE_CONSUMER_GROUP", op 139, auth, yes;
    DeleteConsumerGroup = 603, "DELETE_CONSUMER_GROUP", op 140, auth, yes;
    JoinConsumerGroup = 604, "JOIN_CONSUMER_GROUP", op 148, auth, yes;
    LeaveConsumerGroup = 605, "LEAVE_CONSUMER_GROUP", op 149, auth, yes;
    SyncConsumerGroup = 606, "SYNC_CONSUMER_GROUP", op 2, auth, yes;
    // replog's own admin command (docs/formats.md §17), not Iggy's: the
    // code must equal `common::admin::REPLOG_STATUS_CODE` (tested).
    ReplogStatus = 9000, "REPLOG_STATUS", op 2, auth, yes;
}

impl CommandCode {
    /// The command a request names, from its header's operation byte and
    /// legacy code (see the module documentation). `None` for an unknown
    /// command, and for a code sent with an operation other than its own.
    pub fn from_request(operation: u8, legacy_code: u32) -> Option<Self> {
        match operation {
            OPERATION_REGISTER => Some(Self::LoginRegister),
            OPERATION_LOGOUT => Some(Self::LogoutUser),
            OPERATION_NON_REPLICATED => {
                Self::from_code(legacy_code).filter(|c| c.operation() == OPERATION_NON_REPLICATED)
            }
            op => Self::ALL.iter().copied().find(|c| c.operation() == op),
        }
    }
}

impl std::fmt::Display for CommandCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iggy_binary_protocol::consensus::Operation;

    #[test]
    fn given_each_command_when_sent_like_the_sdk_should_resolve_to_itself() {
        for &c in CommandCode::ALL {
            let legacy = if c.operation() == OPERATION_NON_REPLICATED {
                c.code()
            } else {
                0
            };
            assert_eq!(
                CommandCode::from_request(c.operation(), legacy),
                Some(c),
                "{c}"
            );
        }
    }

    #[test]
    fn given_the_sdk_operation_table_when_compared_should_agree_on_every_code() {
        // The SDK's own mapping (what `operation_for_code` sends) is the
        // oracle; logout is special-cased there exactly as here.
        for &c in CommandCode::ALL {
            let sdk = match c {
                CommandCode::LogoutUser => Operation::Logout,
                CommandCode::LoginRegister => Operation::Register,
                _ => Operation::from_command_code(c.code()).unwrap_or(Operation::NonReplicated),
            };
            assert_eq!(sdk as u8, c.operation(), "{c}");
            assert_eq!(sdk.is_result_framed(), result_framed(c.operation()), "{c}");
            assert!(operation_known(c.operation()), "{c}");
        }
        for op in 0..=u8::MAX {
            assert_eq!(
                Operation::is_known_code(op) && op != 0,
                operation_known(op),
                "operation {op}"
            );
        }
    }

    #[test]
    fn given_only_ping_metadata_and_login_when_gated_should_be_open_before_login() {
        let open: Vec<_> = CommandCode::ALL
            .iter()
            .filter(|c| !c.requires_login())
            .collect();
        assert_eq!(
            open,
            [
                &CommandCode::Ping,
                &CommandCode::GetClusterMetadata,
                &CommandCode::LoginRegister
            ]
        );
    }

    #[test]
    fn given_the_admin_status_code_when_compared_should_be_the_shared_one_and_unknown_to_iggy() {
        assert_eq!(
            CommandCode::ReplogStatus.code(),
            common::admin::REPLOG_STATUS_CODE
        );
        // The SDK sends a code it does not know as NonReplicated, which is
        // how `send_raw_with_response` reaches this command.
        assert_eq!(
            Operation::from_command_code(common::admin::REPLOG_STATUS_CODE),
            None
        );
    }

    #[test]
    fn given_a_code_with_the_wrong_operation_when_resolved_should_be_unknown() {
        assert_eq!(CommandCode::from_request(2, 202), None);
        assert_eq!(CommandCode::from_request(2, 9999), None);
        assert_eq!(CommandCode::from_request(0, 0), None);
        assert_eq!(CommandCode::from_request(64, 0), None);
    }
}
