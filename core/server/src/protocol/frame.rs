//! Cutting the client byte stream into request frames, sans-IO.
//!
//! A frame is a 256-byte consensus header whose `size` (offset 48) is the
//! whole frame length, header included; there is no other length prefix
//! (client_protocol.md §1–2). [`FrameReader`] is fed whatever the socket
//! delivered and hands back whole frames. It says how many bytes it still
//! wants ([`FrameReader::wanted`]) so a driver can issue exact reads (a
//! compio read is not cancel-safe, so it must never read past a frame it
//! may not finish).
//!
//! The size is checked against the ceiling as soon as its four bytes
//! arrive, before the reader asks for (or reserves room for) the body, and
//! the header is validated as soon as its 256 bytes arrive, so a garbage
//! header never makes the reader wait for a body.

use super::error::FrameError;
use bytes::{Bytes, BytesMut};
use consensus::header::{
    Command, CommandHeader, FrameHeader, HEADER_SIZE, RequestHeader, decode_frame, peek_command,
    peek_size,
};

/// Accumulates bytes into whole request frames.
#[derive(Debug)]
pub struct FrameReader {
    buf: BytesMut,
    size_max: u32,
    /// The current frame's size once its header was validated.
    frame_size: Option<usize>,
}

/// A whole request frame: its validated header and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFrame {
    /// The request header.
    pub header: RequestHeader,
    /// The whole frame (header and body), shared so bodies can be sliced
    /// without copying (a send's batch is passed on as a slice of it).
    pub bytes: Bytes,
}

impl RequestFrame {
    /// The body: the bytes after the header.
    pub fn body(&self) -> Bytes {
        self.bytes.slice(HEADER_SIZE..)
    }
}

impl FrameReader {
    /// A reader refusing frames above `size_max` bytes (header included).
    pub fn new(size_max: u32) -> Self {
        Self {
            buf: BytesMut::with_capacity(HEADER_SIZE),
            size_max,
            frame_size: None,
        }
    }

    /// Changes the ceiling for frames whose size is not yet checked (the
    /// driver calls it between frames: at login and logout).
    pub fn set_size_max(&mut self, size_max: u32) {
        self.size_max = size_max;
    }

    /// How many more bytes the current frame needs: the rest of the header
    /// until it is validated, then the rest of the body. Reading exactly
    /// this much never reads into the next frame.
    pub fn wanted(&self) -> usize {
        match self.frame_size {
            Some(size) => size.saturating_sub(self.buf.len()),
            None => HEADER_SIZE.saturating_sub(self.buf.len()),
        }
        .max(1)
    }

    /// Bytes buffered that do not yet make a whole frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Appends bytes from the stream. Bytes past the current frame are
    /// kept for the next one.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one is buffered. An error is final: the
    /// stream is no longer aligned on frames.
    pub fn next_frame(&mut self) -> Result<Option<RequestFrame>, FrameError> {
        if self.frame_size.is_none() {
            if let Some(size) = peek_size(&self.buf) {
                self.check_size(size)?;
            }
            if self.buf.len() < HEADER_SIZE {
                return Ok(None);
            }
            self.frame_size = Some(self.check_header()?);
        }
        let Some(size) = self.frame_size else {
            return Ok(None);
        };
        if self.buf.len() < size {
            // Reserve only now: the size passed the ceiling check.
            self.buf.reserve(size - self.buf.len());
            return Ok(None);
        }
        let bytes = self.buf.split_to(size).freeze();
        self.frame_size = None;
        let frame = decode_frame(&bytes, self.size_max).map_err(FrameError::Header)?;
        let CommandHeader::Request(header) = frame.header.command else {
            return Err(FrameError::NotARequest {
                command: frame.header.command.command() as u8,
            });
        };
        Ok(Some(RequestFrame { header, bytes }))
    }

    /// Call at end of stream: an unfinished frame is an error.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        Err(FrameError::Truncated {
            received: self.buf.len(),
            size: peek_size(&self.buf),
        })
    }

    fn check_size(&self, size: u32) -> Result<usize, FrameError> {
        if (size as usize) < HEADER_SIZE {
            return Err(FrameError::SizeBelowHeader { size });
        }
        if size > self.size_max {
            return Err(FrameError::SizeAboveMax {
                size,
                max: self.size_max,
            });
        }
        Ok(size as usize)
    }

    /// Called once the whole header is buffered.
    fn check_header(&self) -> Result<usize, FrameError> {
        let mut head = [0u8; HEADER_SIZE];
        head.copy_from_slice(&self.buf[..HEADER_SIZE]);
        let size = self.check_size(peek_size(&head).unwrap_or(0))?;
        let command = peek_command(&head).unwrap_or(0);
        if command != Command::Request as u8 {
            return Err(FrameError::NotARequest { command });
        }
        FrameHeader::from_bytes(&head).map_err(FrameError::Header)?;
        Ok(size)
    }
}
