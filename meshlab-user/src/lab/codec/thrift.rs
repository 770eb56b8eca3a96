//! The echo RPC's Thrift binary (strict) message: `echo(1: binary msg) -> binary`.
//! Only what the lab needs: a call carries struct {1: binary}, a reply struct {0: binary}.

use super::{CodecError, Cursor};

const VERSION_1: u32 = 0x8001_0000;
const TYPE_STRING: u8 = 11;
const TYPE_STOP: u8 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageKind {
    Call = 1,
    Reply = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThriftMessage {
    pub name: String,
    pub kind: MessageKind,
    pub seq_id: i32,
    /// The echoed bytes (field 1 of the arguments, field 0 of the result).
    pub body: Vec<u8>,
}

fn thrift_err(what: impl Into<String>) -> CodecError {
    CodecError::Thrift(what.into())
}

impl ThriftMessage {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(VERSION_1 | self.kind as u32).to_be_bytes());
        let name_len = u32::try_from(self.name.len()).expect("short method name");
        out.extend_from_slice(&name_len.to_be_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out.extend_from_slice(&self.seq_id.to_be_bytes());
        let field_id: i16 = match self.kind {
            MessageKind::Call => 1,
            MessageKind::Reply => 0,
        };
        out.push(TYPE_STRING);
        out.extend_from_slice(&field_id.to_be_bytes());
        let body_len = u32::try_from(self.body.len()).expect("lab bodies are small");
        out.extend_from_slice(&body_len.to_be_bytes());
        out.extend_from_slice(&self.body);
        out.push(TYPE_STOP);
    }

    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut c = Cursor::new(buf);
        let version = c.u32("thrift version")?;
        if version & 0xffff_0000 != VERSION_1 {
            return Err(thrift_err(format!(
                "version {version:#010x}, expected strict binary 0x8001"
            )));
        }
        let kind = match version & 0xff {
            1 => MessageKind::Call,
            2 => MessageKind::Reply,
            t => {
                return Err(thrift_err(format!(
                    "message type {t}, expected call or reply"
                )));
            }
        };
        let name_len = c.u32("method name length")? as usize;
        let name = String::from_utf8(c.take(name_len, "method name")?.to_vec()).map_err(|_| {
            CodecError::NotUtf8 {
                what: "method name",
            }
        })?;
        let seq_id = c.u32("sequence id")? as i32;
        let field_type = c.u8("field type")?;
        let field_id = c.u16("field id")? as i16;
        let expected_id = if kind == MessageKind::Call { 1 } else { 0 };
        if field_type != TYPE_STRING || field_id != expected_id {
            return Err(thrift_err(format!(
                "field {field_id} of type {field_type}, expected field {expected_id} of type binary"
            )));
        }
        let body_len = c.u32("body length")? as usize;
        let body = c.take(body_len, "body")?.to_vec();
        if c.u8("field stop")? != TYPE_STOP {
            return Err(thrift_err("expected the end of the struct"));
        }
        if c.remaining() != 0 {
            return Err(thrift_err(format!("{} trailing bytes", c.remaining())));
        }
        Ok(Self {
            name,
            kind,
            seq_id,
            body,
        })
    }
}
