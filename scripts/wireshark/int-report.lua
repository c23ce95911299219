-- Wireshark/tshark dissector for INT telemetry reports (P4.org Telemetry Report Format
-- v2.0) as the testbed's switches send them: UDP to port 32766, the group header, one
-- individual report of RepType 1 (INT) with the baseline metadata its RepMdBits name,
-- the testbed's domain-specific metadata (Domain Specific ID 0x1CA5), and the packet's
-- first bytes. Field names follow incast.p4.layers (TelemetryReport, IntReport).
--
--   tshark -X lua_script:scripts/wireshark/int-report.lua -r telemetry.pcap -V
--   wireshark -X lua_script:scripts/wireshark/int-report.lua telemetry.pcap
--   (or copy this file to ~/.local/lib/wireshark/plugins/)

local PORT = 32766
local INCAST_DOMAIN = 0x1CA5

local p = Proto("int_report", "INT Telemetry Report v2.0")
local rep_types = { [0] = "Inner only", [1] = "INT", [2] = "IOAM" }
local in_types = { [0] = "None", [1] = "TLV", [2] = "Domain specific extension data",
                   [3] = "Ethernet", [4] = "IPv4", [5] = "IPv6" }

local f = {
  version = ProtoField.uint8("int_report.version", "Version", base.DEC, nil, 0xF0),
  hw_id = ProtoField.uint16("int_report.hw_id", "Hardware ID", base.DEC, nil, 0x0FC0),
  seq = ProtoField.uint32("int_report.seq", "Sequence number", base.DEC, nil, 0x003FFFFF),
  node_id = ProtoField.uint32("int_report.node_id", "Node ID", base.DEC),
  rep_type = ProtoField.uint8("int_report.rep_type", "Report type", base.DEC, rep_types, 0xF0),
  in_type = ProtoField.uint8("int_report.in_type", "Inner type", base.DEC, in_types, 0x0F),
  rep_len = ProtoField.uint8("int_report.rep_len", "Report length (words)", base.DEC),
  md_len = ProtoField.uint8("int_report.md_len", "Metadata length (words)", base.DEC),
  dropped = ProtoField.bool("int_report.dropped", "Dropped", 8, nil, 0x80),
  congested = ProtoField.bool("int_report.congested", "Congested queue", 8, nil, 0x40),
  tracked_flow = ProtoField.bool("int_report.tracked_flow", "Tracked flow", 8, nil, 0x20),
  intermediate = ProtoField.bool("int_report.intermediate", "Intermediate report", 8, nil, 0x10),
  rep_md_bits = ProtoField.uint16("int_report.rep_md_bits", "RepMdBits", base.HEX),
  domain_id = ProtoField.uint16("int_report.domain_id", "Domain specific ID", base.HEX),
  ds_md_bits = ProtoField.uint16("int_report.ds_md_bits", "DSMdBits", base.HEX),
  ds_md_status = ProtoField.uint16("int_report.ds_md_status", "DSMdStatus", base.HEX),
  ingress_port = ProtoField.uint16("int_report.ingress_port", "Ingress port", base.DEC),
  egress_port = ProtoField.uint16("int_report.egress_port", "Egress port", base.DEC),
  hop_latency = ProtoField.uint32("int_report.hop_latency", "Hop latency (us)", base.DEC),
  queue = ProtoField.uint8("int_report.queue", "Queue ID", base.DEC),
  queue_occupancy = ProtoField.uint24("int_report.queue_occupancy", "Queue occupancy (bytes)", base.DEC),
  ingress_ts = ProtoField.uint64("int_report.ingress_ts", "Ingress timestamp (us)", base.DEC),
  egress_ts = ProtoField.uint64("int_report.egress_ts", "Egress timestamp (us)", base.DEC),
  l2_ingress_port = ProtoField.uint32("int_report.l2_ingress_port", "Level 2 ingress port", base.DEC),
  l2_egress_port = ProtoField.uint32("int_report.l2_egress_port", "Level 2 egress port", base.DEC),
  tx_utilization = ProtoField.uint32("int_report.tx_utilization", "Egress port TX utilization", base.DEC),
  buffer_id = ProtoField.uint8("int_report.buffer_id", "Buffer ID", base.DEC),
  buffer_occupancy = ProtoField.uint24("int_report.buffer_occupancy", "Buffer occupancy", base.DEC),
  drop_queue = ProtoField.uint8("int_report.drop_queue", "Drop queue ID", base.DEC),
  drop_reason = ProtoField.uint8("int_report.drop_reason", "Drop reason", base.DEC),
  occ_enq_bytes = ProtoField.uint32("int_report.occ_enq_bytes", "Class queue bytes at enqueue", base.DEC),
  occ_deq_bytes = ProtoField.uint32("int_report.occ_deq_bytes", "Class queue bytes at dequeue", base.DEC),
  port_enq_bytes = ProtoField.uint32("int_report.port_enq_bytes", "Port bytes at enqueue", base.DEC),
  port_deq_bytes = ProtoField.uint32("int_report.port_deq_bytes", "Port bytes at dequeue", base.DEC),
  enq_qdepth = ProtoField.uint32("int_report.enq_qdepth", "Queue packets at enqueue", base.DEC),
  deq_qdepth = ProtoField.uint32("int_report.deq_qdepth", "Queue packets at dequeue", base.DEC),
  pkt_len = ProtoField.uint32("int_report.pkt_len", "Frame length", base.DEC),
  flow_hash = ProtoField.uint32("int_report.flow_hash", "Flow hash", base.HEX),
  saddr = ProtoField.ipv4("int_report.saddr", "Source address"),
  daddr = ProtoField.ipv4("int_report.daddr", "Destination address"),
}
local list = {}
for _, v in pairs(f) do list[#list + 1] = v end
p.fields = list

-- RepMdBits, bit 0 the MSB: each bit's fields and their sizes in bytes.
local baseline = {
  [1] = { { "ingress_port", 2 }, { "egress_port", 2 } },
  [2] = { { "hop_latency", 4 } },
  [3] = { { "queue", 1 }, { "queue_occupancy", 3 } },
  [4] = { { "ingress_ts", 8 } },
  [5] = { { "egress_ts", 8 } },
  [6] = { { "l2_ingress_port", 4 }, { "l2_egress_port", 4 } },
  [7] = { { "tx_utilization", 4 } },
  [8] = { { "buffer_id", 1 }, { "buffer_occupancy", 3 } },
  [15] = { { "drop_queue", 1 }, { "drop_reason", 1 }, { nil, 2 } },
}
local domain = { "occ_enq_bytes", "occ_deq_bytes", "port_enq_bytes", "port_deq_bytes", "enq_qdepth",
                 "deq_qdepth", "pkt_len", "flow_hash", "saddr", "daddr" }

local function has(bits, i) return bit.band(bits, bit.rshift(0x8000, i)) ~= 0 end

function p.dissector(buf, pinfo, tree)
  if buf:len() < 20 then return 0 end
  pinfo.cols.protocol = "INT"
  local t = tree:add(p, buf(0, 20), "INT Telemetry Report v2.0")
  local g = t:add(buf(0, 8), "Group header")
  g:add(f.version, buf(0, 1)); g:add(f.hw_id, buf(0, 2)); g:add(f.seq, buf(0, 4)); g:add(f.node_id, buf(4, 4))
  local r = t:add(buf(8, 12), "Individual report")
  r:add(f.rep_type, buf(8, 1)); r:add(f.in_type, buf(8, 1)); r:add(f.rep_len, buf(9, 1))
  r:add(f.md_len, buf(10, 1)); r:add(f.dropped, buf(11, 1)); r:add(f.congested, buf(11, 1))
  r:add(f.tracked_flow, buf(11, 1)); r:add(f.intermediate, buf(11, 1))
  r:add(f.rep_md_bits, buf(12, 2)); r:add(f.domain_id, buf(14, 2)); r:add(f.ds_md_bits, buf(16, 2))
  r:add(f.ds_md_status, buf(18, 2))
  local rep_md, dom, ds = buf(12, 2):uint(), buf(14, 2):uint(), buf(16, 2):uint()
  local off, md_end = 20, 20 + 4 * buf(10, 1):uint()
  local m = t:add(buf(20, math.min(md_end, buf:len()) - 20), "Metadata")
  for i = 0, 15 do
    if has(rep_md, i) and baseline[i] then
      for _, fld in ipairs(baseline[i]) do
        if fld[1] and off + fld[2] <= buf:len() then m:add(f[fld[1]], buf(off, fld[2])) end
        off = off + fld[2]
      end
    end
  end
  if dom == INCAST_DOMAIN then
    for i, name in ipairs(domain) do
      if has(ds, i - 1) and off + 4 <= buf:len() then m:add(f[name], buf(off, 4)); off = off + 4 end
    end
  end
  local dropped = bit.band(buf(11, 1):uint(), 0x80) ~= 0
  -- The packet that follows is its first bytes only: Wireshark marks its TCP
  -- "Malformed" where the headers claim more than the report carries.
  local inner = bit.band(buf(8, 1):uint(), 0x0F)
  if md_end < buf:len() then
    local rest = buf(md_end):tvb()
    if inner == 3 then Dissector.get("eth_withoutfcs"):call(rest, pinfo, tree)
    elseif inner == 4 then Dissector.get("ip"):call(rest, pinfo, tree) end
  end
  pinfo.cols.protocol = "INT"
  pinfo.cols.info:prepend(string.format("INT report node %d seq %d, %s at port %d: ", buf(4, 4):uint(),
    bit.band(buf(0, 4):uint(), 0x3FFFFF), dropped and "drop" or "departure",
    has(rep_md, 1) and buf(22, 2):uint() or 0))
  return buf:len()
end

DissectorTable.get("udp.port"):add(PORT, p)
