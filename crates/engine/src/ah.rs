//! Address handles (`ibv_ah`, IBA 10.2.2.2): where a UD message goes. On RoCEv2 the GRH
//! fields become the IP header: destination GID, source GID index, hop limit, traffic class
//! and flow label.

use wire::Qpn;

use crate::device::Gid;
use crate::error::VerbsError;
use crate::memory::Memory;
use crate::pd::PdHandle;
use crate::qp::Path;
use crate::qp_attr::AhAttr;
use crate::Engine;

/// Handle of an address handle within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AhHandle(pub u32);

#[derive(Debug)]
pub(crate) struct Ah {
    pub(crate) pd: PdHandle,
    pub(crate) attr: AhAttr,
    /// The path, without destination QP and UDP source port (set per WR and QP).
    pub(crate) path: Path,
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_create_ah` in `pd`. RoCE needs the GRH (`is_global`); the source GID and the
    /// destination GID must be of the same IP family.
    pub fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle, VerbsError> {
        if self.pds.get(pd.0).is_none() {
            return Err(VerbsError::InvalidPd);
        }
        if !attr.is_global {
            return Err(VerbsError::InvalidAh);
        }
        let sgid = self
            .gids
            .get(usize::from(attr.sgid_index))
            .ok_or(VerbsError::InvalidGidIndex(u32::from(attr.sgid_index)))?;
        let src_ip = sgid.to_ip();
        let dst_ip = Gid(attr.dgid).to_ip();
        if src_ip.is_ipv4() != dst_ip.is_ipv4() {
            return Err(VerbsError::InvalidGidIndex(u32::from(attr.sgid_index)));
        }
        if self.ahs.len() >= self.config.device.max_ah as usize {
            return Err(VerbsError::TooMany("address handles"));
        }
        let path = Path {
            src_ip,
            dst_ip,
            dest_qpn: 0,
            // UD messages are single packets of at most the port MTU (IBA 9.8): a UD QP has no
            // path MTU of its own.
            mtu: self.config.mtu.bytes() as u32,
            hop_limit: attr.hop_limit,
            traffic_class: attr.traffic_class,
            flow_label: attr.grh_flow_label(),
            udp_src_port: 0,
            // Datagrams always take the network path: their size limit is the port's.
            internal: false,
        };
        let h = self.ahs.insert(Ah {
            pd,
            attr: *attr,
            path,
        });
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users += 1;
        }
        Ok(AhHandle(h))
    }

    /// `ibv_destroy_ah`. WRs already posted with it still go out.
    pub fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        let a = self.ahs.remove(ah.0).ok_or(VerbsError::InvalidAh)?;
        if let Some(p) = self.pds.get_mut(a.pd.0) {
            p.users = p.users.saturating_sub(1);
        }
        Ok(())
    }

    /// `ibv_query_ah`: the attributes it was created with.
    pub fn query_ah(&self, ah: AhHandle) -> Result<AhAttr, VerbsError> {
        Ok(self.ahs.get(ah.0).ok_or(VerbsError::InvalidAh)?.attr)
    }

    /// The path of a UD WR from QP `qpn` through `ah`.
    pub(crate) fn ud_path(&self, ah: AhHandle, qpn: u32, dest_qpn: u32) -> Option<Path> {
        let a = self.ahs.get(ah.0)?;
        let mut p = a.path;
        p.dest_qpn = dest_qpn;
        p.udp_src_port = self
            .config
            .udp_src_port
            .unwrap_or_else(|| wire::src_port_for_qpn(Qpn::new(qpn)));
        Some(p)
    }
}
