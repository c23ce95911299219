/* incast.p4 -- a shallow-buffered Ethernet switch for incast experiments (v1model, bmv2).
 *
 * What it adds to plain L2 forwarding:
 *   - class queues: DSCP (or 802.1Q PCP) -> class c -> bmv2 priority queue 7 - c,
 *     so class 0 is served first (strict priority);
 *   - a byte-accurate egress buffer per (port, class): bmv2 counts queue depth in
 *     packets, so admission is decided here against a byte occupancy kept in
 *     registers (added at admission, removed when the packet leaves), with bmv2's
 *     own depth set above it only as a backstop; every refusal is counted;
 *   - 802.3x PAUSE: when a port's occupancy passes XOFF, every other port gets
 *     a PAUSE frame (refreshed before it expires while still above XOFF) and quanta
 *     0 once the occupancy of every congested port has fallen to XON;
 *   - or 802.1Qbb PFC (cfg pfc = 1): the same per class, each class queue against its
 *     own XOFF/XON, a PFC frame naming that class only, so the other classes flow on;
 *   - received PAUSE/PFC frames are obeyed (cfg obey = 1), per port and class: bmv2
 *     fixes a packet's departure time when it enters an egress queue, so no queue can
 *     be stopped once filled; instead a packet admitted to a paused (port, class) goes
 *     round the switch's hold loop (a veth pair from HOLD_PORT back to
 *     HOLD_RETURN_PORT, paced by bmv2) until the pause ends, still counted in that
 *     port's buffer, so the buffer fills and this switch's own PAUSE goes upstream.
 *     Order is kept: while any packet of a (port, class) is in the loop, the next ones
 *     follow it there, each tagged with its place (hold_t); one leaves the loop only
 *     when it is the oldest, the others go round again. What the egress queue held
 *     when the PAUSE came still leaves (at most the port's buffer; a real port stops
 *     within a frame);
 *   - queue telemetry: egress-to-egress (and, for drops, ingress-to-egress) clones to
 *     a collector port, truncated, sent as INT telemetry reports (the P4.org
 *     Telemetry Report Format v2.0, in postcard mode: one report per packet and hop,
 *     over UDP), with this switch's queue and port bytes as domain-specific metadata.
 *
 * The control plane (incast/dataplane/bmv2.py) fills the tables from the scenario: the
 * switch's settings are the parameters of `configure` (the default action of a keyless
 * table in ingress and in egress), each queue's its `queue_config` entries, each
 * port's MAC its `port_config` entry; no setting lives in a register, so a P4Runtime
 * client writes them all. The registers hold the state the pipeline keeps. Register
 * and queue-table indexes are port * 8 + class.
 *
 * Ingress and egress run in different bmv2 threads and share registers. bmv2 locks
 * the register arrays an action uses for the whole action, and nothing wider (an
 * @atomic block that spans an if is split into several actions): so every
 * read-modify-write of shared state below is one action. A lost update would leak
 * buffer occupancy until the port admits nothing more.
 */
#include <core.p4>
#include <v1model.p4>

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<16> ETHERTYPE_VLAN = 0x8100;
const bit<16> ETHERTYPE_MAC_CONTROL = 0x8808;
const bit<16> MAC_CONTROL_PAUSE = 0x0001;
const bit<16> MAC_CONTROL_PFC = 0x0101;
const bit<8>  PROTO_TCP = 6;
const bit<8>  PROTO_UDP = 17;

const bit<32> NPORTS = 512;
const bit<32> NQUEUES = 4096;                   /* NPORTS * 8 classes */
const bit<32> TELEMETRY_SESSION = 1;            /* mirror session to the collector port */
const bit<32> PAUSE_MC_SESSION = 2;             /* mirror session to multicast group 2: every host port */
const bit<9>  HOLD_PORT = 508;                  /* into the hold loop (obeying PAUSE) ... */
const bit<9>  HOLD_RETURN_PORT = 509;           /* ... and back from it */
const bit<32> HOLD_TAG_BYTES = 4;               /* hold_t, in front of a frame in the loop */
/* Telemetry reports (Telemetry Report Format v2.0): Ethernet, IPv4 and UDP to the
 * collector, the group header (8 bytes), the individual report (12) with its metadata
 * (68), and the packet's first 56 bytes (its Ethernet/IPv4/TCP headers, in whole
 * 4-byte words, as the report's length counts them). */
const bit<16> TELEMETRY_UDP_PORT = 32766;       /* source and destination: the port INT collectors listen on by custom */
const bit<32> TELEMETRY_SRC_NET = 0xC6120000;   /* 198.18.0.0/16 + switch id: the report's source (RFC 2544's benchmarking range) */
const bit<32> TELEMETRY_COLLECTOR_ADDR = 0xC613FFFE;   /* 198.19.255.254 */
const bit<16> INT_DOMAIN_ID = 0x1CA5;           /* this testbed's domain-specific metadata */
const bit<16> INT_REP_MD_BITS = 0x7C00;         /* baseline bits 1-5: ports, hop latency, queue, ingress and egress timestamps */
const bit<16> INT_DS_MD_BITS = 0xFFC0;          /* domain-specific bits 0-9: the ten words of incast's queue state */
const bit<8>  INT_MD_WORDS = 17;                /* 7 baseline + 10 domain-specific */
const bit<32> TELEMETRY_INNER_BYTES = 56;
const bit<32> TELEMETRY_FRAME_BYTES = 14 + 20 + 8 + 8 + 12 + 68 + 56;
const bit<8>  FL_CLONE = 1;                     /* field list preserved in clones: @field_list(1) */

const bit<8> CLONE_NONE = 0;
const bit<8> CLONE_TELEMETRY = 1;
const bit<8> CLONE_PAUSE = 2;

const bit<8> EVENT_DEQUEUE = 0;
const bit<8> EVENT_DROP = 1;

const bit<8> TEL_OFF = 0;
const bit<8> TEL_ALL = 1;
const bit<8> TEL_ONE_IN_N = 2;
const bit<8> TEL_ON_CHANGE = 3;
const bit<8> TEL_ABOVE = 4;

typedef bit<48> mac_t;

/* A frame's place in the hold loop of its (port, class): it leaves in this order. */
header hold_t {
    bit<32> seq;
}

header ethernet_t {
    mac_t   dst;
    mac_t   src;
    bit<16> etherType;
}

header vlan_t {
    bit<3>  pcp;
    bit<1>  dei;
    bit<12> vid;
    bit<16> etherType;
}

header mac_control_t {
    bit<16> opcode;
}

header pause_t {
    bit<16> quanta;
}

header pfc_t {
    bit<16> class_enable;
    bit<128> quanta;      /* 8 x 16-bit quanta, class 0 first */
}

header pad_t {
    bit<336> zeros;       /* 42 bytes: a PAUSE frame is 60 bytes before the FCS */
}

header ipv4_t {
    bit<4>  version;
    bit<4>  ihl;
    bit<6>  dscp;
    bit<2>  ecn;
    bit<16> totalLen;
    bit<16> identification;
    bit<3>  flags;
    bit<13> fragOffset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> hdrChecksum;
    bit<32> srcAddr;
    bit<32> dstAddr;
}

header tcp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<32> seqNo;
    bit<32> ackNo;
    bit<4>  dataOffset;
    bit<4>  res;
    bit<8>  flags;
    bit<16> window;
    bit<16> checksum;
    bit<16> urgentPtr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length;
    bit<16> checksum;
}

/* Telemetry Report Group Header (v2.0). The same layouts are the Scapy layers
 * incast.p4.layers.TelemetryReport and IntReport: change both together. */
header report_group_t {
    bit<4>  version;         /* 2 */
    bit<6>  hw_id;
    bit<22> seq;             /* per switch, +1 per report: gaps are lost reports */
    bit<32> node_id;         /* the switch id */
}

/* Individual Report Header, its INT main contents (RepType 1) and the metadata this
 * switch always sends (INT_REP_MD_BITS, INT_DS_MD_BITS), 80 bytes. */
header int_report_t {
    bit<4>  rep_type;        /* 1: INT */
    bit<4>  in_type;         /* 3: an Ethernet frame follows */
    bit<8>  rep_len;         /* 4-byte words after this one: main contents, metadata, packet */
    bit<8>  md_len;          /* 4-byte words of metadata */
    bit<1>  dropped;         /* the packet was dropped (its queue was full) */
    bit<1>  congested;
    bit<1>  tracked_flow;    /* 1: postcard mode samples the packet here */
    bit<1>  intermediate;
    bit<4>  rsvd;
    bit<16> rep_md_bits;
    bit<16> domain_id;
    bit<16> ds_md_bits;
    bit<16> ds_md_status;
    /* baseline metadata */
    bit<16> ingress_port;
    bit<16> egress_port;
    bit<32> hop_latency;     /* us in the queue */
    bit<8>  queue;           /* class */
    bit<24> queue_occupancy; /* class queue bytes at enqueue (saturates) */
    bit<64> ingress_ts;      /* us, switch clock: arrival */
    bit<64> egress_ts;       /* us, switch clock: departure (drop: time of refusal) */
    /* domain-specific metadata (INT_DOMAIN_ID) */
    bit<32> occ_enq_bytes;   /* class queue bytes after admission (drop: before) */
    bit<32> occ_deq_bytes;   /* class queue bytes after departure */
    bit<32> port_enq_bytes;  /* all of the port's queues, after admission */
    bit<32> port_deq_bytes;  /* ... after departure */
    bit<32> enq_qdepth;      /* bmv2's queue depth in packets at enqueue */
    bit<32> deq_qdepth;      /* ... at dequeue */
    bit<32> pkt_len;         /* bytes of the frame */
    bit<32> flow_hash;       /* crc32 of the IPv4 5-tuple */
    bit<32> saddr;
    bit<32> daddr;
}

struct headers_t {
    hold_t        hold;
    ethernet_t    tel_eth;
    ipv4_t        tel_ipv4;
    udp_t         tel_udp;
    report_group_t tel_group;
    int_report_t  tel;
    ethernet_t    ethernet;
    vlan_t        vlan;
    mac_control_t mac_control;
    pause_t       pause;
    pfc_t         pfc;
    pad_t         pad;
    ipv4_t        ipv4;
    tcp_t         tcp;
    udp_t         udp;
}

/* The switch's settings, as the control plane sets them (action configure). */
struct config_t {
    bit<32> switch_id;
    bit<32> pause_on;
    bit<32> xoff;           /* bytes in the port's queues */
    bit<32> xon;
    bit<32> quanta;         /* pause quanta sent at XOFF (512 bit-times each) */
    bit<32> pause_us;       /* how long those quanta last at the link rate */
    bit<32> refresh_us;     /* refresh a pause this long before it expires */
    bit<32> tel_mode;       /* 0 off, 1 every packet, 2 one in N, 3 on change, 4 above threshold */
    bit<32> tel_n;
    bit<32> tel_threshold;  /* bytes (mode 4) */
    bit<32> tel_delta;      /* bytes (mode 3) */
    bit<32> late_us;        /* a packet that waited longer before ingress is late */
    bit<32> ecn_k;          /* mark CE when the class queue holds more bytes (0: off) */
    bit<32> pfc;            /* 1: per-class PFC against each queue's xoff/xon, not 802.3x */
    bit<32> obey;           /* 1: obey PAUSE and PFC received at the ports */
    bit<32> quantum_us1024; /* one pause quantum at the link rate, in us/1024 */
    bit<32> pool_bytes;     /* shared buffer: the pool every queue draws from (0: none) */
    bit<32> pool_alpha16;   /* a queue may hold alpha x the free pool; alpha in 1/16 */
}

/* A (port, class) queue's settings (action configure_queue). */
struct queue_config_t {
    bit<32> limit;          /* bytes it may hold */
    bit<32> xoff;           /* PFC: pause its class above this many bytes ... */
    bit<32> xon;            /* ... and resume at this many */
}

struct metadata_t {
    @field_list(1) bit<8>  clone_kind;
    @field_list(1) bit<8>  event;
    @field_list(1) bit<8>  qclass;
    @field_list(1) bit<1>  accounted;
    bit<1>  pool_ok;     /* the shared pool has room for the packet in its queue */
    @field_list(1) bit<16> quanta;
    @field_list(1) bit<16> in_port;
    @field_list(1) bit<16> out_port;
    @field_list(1) bit<32> pkt_len;
    @field_list(1) bit<32> occ_enq;
    @field_list(1) bit<32> occ_deq;
    @field_list(1) bit<32> port_enq;
    @field_list(1) bit<32> port_deq;
    @field_list(1) bit<32> enq_qdepth;
    @field_list(1) bit<32> deq_qdepth;
    @field_list(1) bit<32> deq_timedelta;
    @field_list(1) bit<48> enq_ts;
    @field_list(1) bit<48> deq_ts;
    @field_list(1) bit<32> flow_hash;
    @field_list(1) bit<32> saddr;
    @field_list(1) bit<32> daddr;
    @field_list(1) mac_t   port_mac;
    @field_list(1) bit<1>  held;  /* sent into the hold loop: its port is paused */
    bit<32> hold_seq;
    bit<32> qidx;        /* register index of (port, class): port * 8 + class */
    bit<32> pidx;        /* register index of the port */
    bit<1>  send_pause;
    bit<1>  send_xon;
    bit<1>  sample;
    bit<1>  ecn_marked;  /* the IPv4 header changed: its checksum is recomputed */
    config_t       cfg;  /* the switch's settings (configure), read each pass */
    queue_config_t q;    /* this packet's queue's (configure_queue) */
}

/* State shared by ingress (admission) and egress (departure). */
register<bit<32>>(NQUEUES) occ_bytes;          /* per (port, class) */
register<bit<32>>(NPORTS) port_bytes;          /* per port, all classes */
/* Shared buffer (cfg.pool_bytes != 0): the bytes every queue of the switch holds
 * together, and the most it held. */
register<bit<32>>(1) pool_used;
register<bit<32>>(1) pool_max_bytes;
register<bit<48>>(NPORTS) pause_until;         /* us; a port is paused while now < this */
register<bit<1>>(NPORTS) congested;            /* the port passed XOFF and has not fallen to XON */
register<bit<32>>(1) congested_ports;          /* how many: the last one to reach XON sends XON */
register<bit<48>>(1) pause_all_until;          /* us; when the last broadcast PAUSE expires */
/* PFC: the same state per class queue (port * 8 + class) and per class. */
register<bit<48>>(NQUEUES) pfc_until;          /* us; a port's class is paused while now < this */
register<bit<1>>(NQUEUES) queue_congested;     /* the class queue passed its XOFF, not yet at XON */
register<bit<32>>(8) congested_queues;         /* per class: the last one to reach XON sends XON */
register<bit<48>>(8) pfc_all_until;            /* per class: when the last PFC frame expires */
/* Obeying: the pause each (port, class) received from its peer (802.3x pauses all 8). */
register<bit<48>>(NQUEUES) rx_until;           /* us; paused by the peer while now < this */
register<bit<48>>(NQUEUES) rx_mark;            /* us; paused time since then not yet in rx_held_us */
register<bit<48>>(NQUEUES) rx_held_us;         /* us paused by the peer so far */
register<bit<32>>(NQUEUES) hold_tail;          /* the next place in the (port, class)'s hold loop */
register<bit<32>>(NQUEUES) hold_head;          /* the oldest place still in it (head == tail: empty) */
counter(1, CounterType.packets) telemetry_suppressed;

/* The settings: one action for the switch's and one for a queue's, default action or
 * entry of a table in ingress and one in egress (each pass reads them afresh: a clone
 * keeps only the fields of its field list). */
action configure(inout metadata_t meta, bit<32> switch_id, bit<32> pause_on, bit<32> xoff, bit<32> xon,
                 bit<32> quanta, bit<32> pause_us, bit<32> refresh_us, bit<32> tel_mode, bit<32> tel_n,
                 bit<32> tel_threshold, bit<32> tel_delta, bit<32> late_us, bit<32> ecn_k, bit<32> pfc,
                 bit<32> obey, bit<32> quantum_us1024, bit<32> pool_bytes, bit<32> pool_alpha16) {
    meta.cfg.switch_id = switch_id;
    meta.cfg.pause_on = pause_on;
    meta.cfg.xoff = xoff;
    meta.cfg.xon = xon;
    meta.cfg.quanta = quanta;
    meta.cfg.pause_us = pause_us;
    meta.cfg.refresh_us = refresh_us;
    meta.cfg.tel_mode = tel_mode;
    meta.cfg.tel_n = tel_n;
    meta.cfg.tel_threshold = tel_threshold;
    meta.cfg.tel_delta = tel_delta;
    meta.cfg.late_us = late_us;
    meta.cfg.ecn_k = ecn_k;
    meta.cfg.pfc = pfc;
    meta.cfg.obey = obey;
    meta.cfg.quantum_us1024 = quantum_us1024;
    meta.cfg.pool_bytes = pool_bytes;
    meta.cfg.pool_alpha16 = pool_alpha16;
}

/* A queue without an entry admits nothing. */
action configure_queue(inout metadata_t meta, bit<32> limit, bit<32> xoff, bit<32> xon) {
    meta.q.limit = limit;
    meta.q.xoff = xoff;
    meta.q.xon = xon;
}

/* ---------------------------------------------------------------- parser */
parser IncastParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t std) {
    state start {
        transition select(std.ingress_port) {
            HOLD_RETURN_PORT: parse_hold;
            default: parse_ethernet;
        }
    }
    state parse_hold {
        pkt.extract(hdr.hold);
        transition parse_ethernet;
    }
    state parse_ethernet {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            ETHERTYPE_VLAN: parse_vlan;
            ETHERTYPE_MAC_CONTROL: parse_mac_control;
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_vlan {
        pkt.extract(hdr.vlan);
        transition select(hdr.vlan.etherType) {
            ETHERTYPE_MAC_CONTROL: parse_mac_control;
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_mac_control {
        pkt.extract(hdr.mac_control);
        transition select(hdr.mac_control.opcode) {
            MAC_CONTROL_PAUSE: parse_pause;
            MAC_CONTROL_PFC: parse_pfc;
            default: accept;
        }
    }
    state parse_pause {
        pkt.extract(hdr.pause);
        transition accept;
    }
    state parse_pfc {
        pkt.extract(hdr.pfc);
        transition accept;
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            PROTO_TCP: parse_tcp;
            PROTO_UDP: parse_udp;
            default: accept;
        }
    }
    state parse_tcp {
        pkt.extract(hdr.tcp);
        transition accept;
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition accept;
    }
}

control IncastVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply { }
}

/* --------------------------------------------------------------- ingress */
control IncastIngress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t std) {
    counter(NQUEUES, CounterType.packets_and_bytes) drops;
    counter(NQUEUES, CounterType.packets) ecn_marks;
    counter(NPORTS, CounterType.packets) mac_control_rx;
    counter(NPORTS, CounterType.packets) pause_tx;
    counter(NPORTS, CounterType.packets) pause_rx;      /* PAUSE/PFC frames with a quanta */
    counter(NPORTS, CounterType.packets) xon_rx;        /* ... with none (resume) */
    counter(NQUEUES, CounterType.packets) held;         /* packets sent into the hold loop */

    /* Everything 0 until the control plane sets it: no PAUSE, no telemetry, no pool. */
    table switch_config {
        actions = { configure(meta); }
        default_action = configure(meta, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    }
    table queue_config {
        key = { meta.qidx: exact; }
        actions = { configure_queue(meta); }
        default_action = configure_queue(meta, 0, 0, 0);
        size = NQUEUES;
    }

    action drop() {
        mark_to_drop(std);
    }
    action set_egress(bit<9> port) {
        std.egress_spec = port;
    }
    action flood() {
        std.mcast_grp = 1;
    }
    table l2_forward {
        key = { hdr.ethernet.dst: exact; }
        actions = { set_egress; flood; drop; }
        default_action = flood();
        size = 1024;
    }

    action set_class(bit<8> qclass) {
        meta.qclass = qclass;
    }
    table classify_dscp {
        key = { hdr.ipv4.dscp: exact; }
        actions = { set_class; NoAction; }
        default_action = NoAction();   /* unmapped DSCPs stay in class 0 */
        size = 64;
    }
    table classify_pcp {
        key = { hdr.vlan.pcp: exact; }
        actions = { set_class; NoAction; }
        default_action = NoAction();
        size = 8;
    }

    /* Admission against the byte limit of (egress port, class). */
    action admit() {
        /* lab 5 begin: admit the packet (meta.pkt_len bytes) if its class queue
         * (occ_bytes[meta.qidx]) stays within its limit (meta.q.limit); if so
         * add its bytes to the class queue and to the port (port_bytes[meta.pidx]). Set
         * meta.accounted (1: admitted), meta.occ_enq and meta.port_enq (after it). */
        /* lab 5 stub: meta.accounted = 0; meta.occ_enq = 0; meta.port_enq = 0; */
        bit<32> occ;
        bit<32> port_occ;
        occ_bytes.read(occ, meta.qidx);
        port_bytes.read(port_occ, meta.pidx);
        bool ok = occ + meta.pkt_len <= meta.q.limit;
        occ = ok ? occ + meta.pkt_len : occ;
        port_occ = ok ? port_occ + meta.pkt_len : port_occ;
        occ_bytes.write(meta.qidx, occ);
        port_bytes.write(meta.pidx, port_occ);
        meta.accounted = ok ? 1w1 : 1w0;
        meta.occ_enq = occ;
        meta.port_enq = port_occ;
        /* lab 5 end */
    }

    /* The port is above XOFF: mark it congested; PAUSE is due if no port was, or
     * if the last PAUSE is about to expire. */
    action note_xoff() {
        /* lab 6 begin: this port (meta.pidx) is above XOFF. Mark it congested
         * (congested[pidx] = 1, and count it in congested_ports[0] if it was not
         * already) and decide whether a PAUSE goes out now (meta.send_pause = 1): when
         * no port was congested before, or when the last PAUSE (it lasts until
         * pause_all_until[0], in us) expires within meta.cfg.refresh_us; then it lasts
         * until now + meta.cfg.pause_us. */
        /* lab 6 stub: meta.send_pause = 0; */
        bit<1> was_congested;
        bit<32> n;
        bit<48> until;
        congested.read(was_congested, meta.pidx);
        congested_ports.read(n, 0);
        pause_all_until.read(until, 0);
        bit<48> now = std.ingress_global_timestamp;
        bool send = n == 0 || now + (bit<48>)meta.cfg.refresh_us >= until;
        congested.write(meta.pidx, 1);
        congested_ports.write(0, was_congested == 0 ? n + 1 : n);
        pause_all_until.write(0, send ? now + (bit<48>)meta.cfg.pause_us : until);
        meta.send_pause = send ? 1w1 : 1w0;
        /* lab 6 end */
    }

    /* PFC: the class queue is above its XOFF; as note_xoff, for its class alone. */
    action note_class_xoff() {
        bit<1> was_congested;
        bit<32> n;
        bit<48> until;
        bit<32> c = (bit<32>)meta.qclass;
        queue_congested.read(was_congested, meta.qidx);
        congested_queues.read(n, c);
        pfc_all_until.read(until, c);
        bit<48> now = std.ingress_global_timestamp;
        bool send = n == 0 || now + (bit<48>)meta.cfg.refresh_us >= until;
        queue_congested.write(meta.qidx, 1);
        congested_queues.write(c, was_congested == 0 ? n + 1 : n);
        pfc_all_until.write(c, send ? now + (bit<48>)meta.cfg.pause_us : until);
        meta.send_pause = send ? 1w1 : 1w0;
    }

    /* A pause of `quanta` for (port, class) q from now on (0: it ends now); the time
     * the last one held it is added up first. */
    action obey_pause(bit<32> q, bit<16> quanta) {
        bit<48> until;
        bit<48> mark;
        bit<48> held_us;
        rx_until.read(until, q);
        rx_mark.read(mark, q);
        rx_held_us.read(held_us, q);
        bit<48> now = std.ingress_global_timestamp;
        bit<48> end = until < now ? until : now;
        rx_held_us.write(q, end > mark ? held_us + (end - mark) : held_us);
        rx_mark.write(q, now);
        rx_until.write(q, now + (((bit<48>)quanta * (bit<48>)meta.cfg.quantum_us1024) >> 10));
    }

    /* A packet admitted to a paused (port, class), or to one whose earlier packets are
     * still in the hold loop, goes into the loop instead of its egress queue. */
    action hold_if_paused() {
        bit<48> until;
        bit<32> head;
        bit<32> tail;
        rx_until.read(until, meta.qidx);
        hold_head.read(head, meta.qidx);
        hold_tail.read(tail, meta.qidx);
        bool hold = until > std.ingress_global_timestamp || head != tail;
        hold_tail.write(meta.qidx, hold ? tail + 1 : tail);
        std.egress_spec = hold ? HOLD_PORT : std.egress_spec;
        meta.held = hold ? 1w1 : 1w0;
        meta.hold_seq = tail;
    }

    /* Back from the loop: on to its port if the pause is over and it is the oldest in
     * the loop (the loop's rotation at the pause's end is arbitrary), else round again. */
    action hold_return() {
        bit<48> until;
        bit<32> head;
        rx_until.read(until, meta.qidx);
        hold_head.read(head, meta.qidx);
        bool go = until <= std.ingress_global_timestamp && hdr.hold.seq == head;
        hold_head.write(meta.qidx, go ? head + 1 : head);
        std.egress_spec = go ? std.egress_spec : HOLD_PORT;
        meta.held = go ? 1w0 : 1w1;
    }

    /* The shared pool: room for the packet in its class queue? Without a pool (its
     * size 0) always. */
    action pool_check() {
        bit<32> size = meta.cfg.pool_bytes;
        bit<32> alpha16 = meta.cfg.pool_alpha16;
        bit<32> used;
        bit<32> occ;
        pool_used.read(used, 0);
        occ_bytes.read(occ, meta.qidx);
        bit<32> free = used < size ? size - used : 0;
        bool fits = used + meta.pkt_len <= size && occ + meta.pkt_len <= (free * alpha16) >> 4;
        meta.pool_ok = size == 0 || fits ? 1w1 : 1w0;
    }

    action pool_take() {
        bit<32> size = meta.cfg.pool_bytes;
        bit<32> used;
        bit<32> most;
        pool_used.read(used, 0);
        pool_max_bytes.read(most, 0);
        used = size != 0 ? used + meta.pkt_len : used;
        pool_used.write(0, used);
        pool_max_bytes.write(0, used > most ? used : most);
    }

    /* The buffer state a packet back from the loop finds (its bytes are in it). */
    action read_occupancy() {
        occ_bytes.read(meta.occ_enq, meta.qidx);
        port_bytes.read(meta.port_enq, meta.pidx);
    }

    apply {
        if (std.ingress_port == HOLD_PORT) {
            mark_to_drop(std);   /* the loop runs one way: whatever comes in here is not ours */
            return;
        }
        switch_config.apply();
        if (hdr.mac_control.isValid()) {
            /* PAUSE and PFC are link-local: consumed here, never forwarded. */
            bit<32> port = (bit<32>)std.ingress_port;
            mac_control_rx.count(port);
            mark_to_drop(std);
            if (meta.cfg.obey == 0) {
                return;
            }
            bit<32> q = port * 8;
            if (hdr.pause.isValid()) {
                if (hdr.pause.quanta == 0) {
                    xon_rx.count(port);
                } else {
                    pause_rx.count(port);
                }
                obey_pause(q, hdr.pause.quanta);
                obey_pause(q + 1, hdr.pause.quanta);
                obey_pause(q + 2, hdr.pause.quanta);
                obey_pause(q + 3, hdr.pause.quanta);
                obey_pause(q + 4, hdr.pause.quanta);
                obey_pause(q + 5, hdr.pause.quanta);
                obey_pause(q + 6, hdr.pause.quanta);
                obey_pause(q + 7, hdr.pause.quanta);
            } else if (hdr.pfc.isValid()) {
                /* Class 0's quanta first on the wire: the top 16 bits. */
                bit<16> en = hdr.pfc.class_enable;
                bit<128> qs = hdr.pfc.quanta;
                if (qs == 0) {
                    xon_rx.count(port);
                } else {
                    pause_rx.count(port);
                }
                if ((en & 1) != 0)   { obey_pause(q,     (bit<16>)(qs >> 112)); }
                if ((en & 2) != 0)   { obey_pause(q + 1, (bit<16>)(qs >> 96)); }
                if ((en & 4) != 0)   { obey_pause(q + 2, (bit<16>)(qs >> 80)); }
                if ((en & 8) != 0)   { obey_pause(q + 3, (bit<16>)(qs >> 64)); }
                if ((en & 16) != 0)  { obey_pause(q + 4, (bit<16>)(qs >> 48)); }
                if ((en & 32) != 0)  { obey_pause(q + 5, (bit<16>)(qs >> 32)); }
                if ((en & 64) != 0)  { obey_pause(q + 6, (bit<16>)(qs >> 16)); }
                if ((en & 128) != 0) { obey_pause(q + 7, (bit<16>)qs); }
            }
            return;
        }
        meta.qclass = 0;
        if (hdr.vlan.isValid()) {
            classify_pcp.apply();
        }
        if (hdr.ipv4.isValid()) {
            classify_dscp.apply();
            meta.saddr = hdr.ipv4.srcAddr;
            meta.daddr = hdr.ipv4.dstAddr;
            if (hdr.tcp.isValid()) {
                hash(meta.flow_hash, HashAlgorithm.crc32, (bit<32>)0,
                     { hdr.ipv4.srcAddr, hdr.ipv4.dstAddr, hdr.ipv4.protocol,
                       hdr.tcp.srcPort, hdr.tcp.dstPort }, (bit<32>)0xffffffff);
            } else if (hdr.udp.isValid()) {
                hash(meta.flow_hash, HashAlgorithm.crc32, (bit<32>)0,
                     { hdr.ipv4.srcAddr, hdr.ipv4.dstAddr, hdr.ipv4.protocol,
                       hdr.udp.srcPort, hdr.udp.dstPort }, (bit<32>)0xffffffff);
            }
        }
        /* bmv2 serves the highest priority number first: class 0 -> queue 7. */
        std.priority = (bit<3>)(7 - meta.qclass);
        meta.pkt_len = std.packet_length;
        meta.in_port = (bit<16>)std.ingress_port;
        l2_forward.apply();
        if (std.ingress_port == HOLD_RETURN_PORT && (std.mcast_grp != 0 || std.egress_spec == 511)) {
            mark_to_drop(std);   /* only held unicast comes back from the loop */
            return;
        }
        if (std.mcast_grp != 0 || std.egress_spec == 511) {
            return;   /* floods (ARP) and drops are not buffered against the limits */
        }

        meta.qidx = (bit<32>)std.egress_spec * 8 + (bit<32>)meta.qclass;
        meta.pidx = (bit<32>)std.egress_spec;
        meta.out_port = (bit<16>)std.egress_spec;
        meta.enq_ts = std.ingress_global_timestamp;
        queue_config.apply();
        if (std.ingress_port == HOLD_RETURN_PORT) {
            /* Admitted (and its XOFF decided) when it first arrived; its bytes are the
             * frame's, without the tag. */
            meta.accounted = 1;
            meta.pkt_len = std.packet_length - HOLD_TAG_BYTES;
            read_occupancy();
            hold_return();
            if (meta.held == 0) {
                hdr.hold.setInvalid();
            }
            return;
        }
        /* A shared buffer first: a queue may hold at most alpha x the pool's free bytes
         * (a dynamic threshold, as merchant switch silicon has), and the pool no more
         * than its size; then the queue's own limit (its cap) as always. */
        pool_check();
        if (meta.pool_ok == 1) {
            admit();
        } else {
            meta.accounted = 0;
            read_occupancy();
        }
        if (meta.accounted == 1) {
            pool_take();
        }
        if (meta.accounted == 1 && meta.cfg.obey != 0) {
            hold_if_paused();
            if (meta.held == 1) {
                hdr.hold.setValid();
                hdr.hold.seq = meta.hold_seq;
                held.count(meta.qidx);
            }
        }

        /* ECN (DCTCP's K): an ECN-capable packet that finds more than K bytes in its
         * class queue is queued marked CE instead of unmarked; the others as before. */
        if (meta.accounted == 1 && meta.cfg.ecn_k != 0 && hdr.ipv4.isValid() && hdr.ipv4.ecn != 0
                && meta.occ_enq - meta.pkt_len > meta.cfg.ecn_k) {
            hdr.ipv4.ecn = 3;
            meta.ecn_marked = 1;
            ecn_marks.count(meta.qidx);
        }

        if (meta.accounted == 0) {
            drops.count(meta.qidx);
            mark_to_drop(std);
            if (meta.cfg.tel_mode != 0) {
                meta.clone_kind = CLONE_TELEMETRY;
                meta.event = EVENT_DROP;
                meta.deq_ts = std.ingress_global_timestamp;
            }
        }

        /* 802.3x: when a port's queues pass XOFF, every other port is paused
         * at once (one clone to multicast group 2), as a shallow shared-buffer switch
         * must: by the time each sender is paused on its own next packet, the
         * headroom above XOFF is gone. Refreshed while still above XOFF. */
        if (meta.cfg.pause_on != 0 && meta.cfg.pfc != 0) {
            /* PFC: the class queue against its own XOFF; the PFC frame names the class. */
            if (meta.occ_enq > meta.q.xoff) {
                note_class_xoff();
            }
        } else if (meta.cfg.pause_on != 0) {
            if (meta.port_enq > meta.cfg.xoff) {
                note_xoff();
            }
        }
        if (meta.send_pause == 1) {
            if (meta.clone_kind == CLONE_TELEMETRY) {
                telemetry_suppressed.count(0);   /* one clone per packet: PAUSE wins */
            }
            meta.clone_kind = CLONE_PAUSE;
            meta.quanta = (bit<16>)meta.cfg.quanta;
            pause_tx.count(meta.pidx);
            clone_preserving_field_list(CloneType.I2E, PAUSE_MC_SESSION, FL_CLONE);
        }
        if (meta.clone_kind == CLONE_TELEMETRY) {
            clone_preserving_field_list(CloneType.I2E, TELEMETRY_SESSION, FL_CLONE);
        }
    }
}

/* ---------------------------------------------------------------- egress */
control IncastEgress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t std) {
    register<bit<32>>(1) tel_seq;
    register<bit<32>>(NPORTS) tel_count;       /* one-in-N sampling */
    register<bit<32>>(NQUEUES) tel_last;       /* on-change sampling */
    /* bmv2 falling behind: how long packets waited between arriving at the switch and
     * entering their egress queue (bmv2's input queue + the ingress pipeline), a time
     * the P4 buffer does not see. Its maximum, and a count of packets past cfg.late_us. */
    register<bit<32>>(1) ingress_wait_max_us;
    counter(1, CounterType.packets) ingress_late;
    counter(NQUEUES, CounterType.packets_and_bytes) tx;
    counter(NPORTS, CounterType.packets) xon_tx;
    counter(NPORTS, CounterType.packets) pause_port_tx;   /* PAUSE frames sent, per port */
    counter(NPORTS, CounterType.packets) xon_port_tx;     /* quanta-0 frames sent, per port */
    /* Frames that left a (port, class) its peer had paused: what its egress queue held
     * when the pause came (bmv2 cannot stop a queue; a real port stops within a frame). */
    counter(NQUEUES, CounterType.packets) sent_while_paused;

    table egress_switch_config {
        actions = { configure(meta); }
        default_action = configure(meta, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    }
    table egress_queue_config {
        key = { meta.qidx: exact; }
        actions = { configure_queue(meta); }
        default_action = configure_queue(meta, 0, 0, 0);
        size = NQUEUES;
    }
    /* The source address of the PAUSE and PFC frames a port sends. */
    action set_port_mac(mac_t mac) {
        meta.port_mac = mac;
    }
    table port_config {
        key = { std.egress_port: exact; }
        actions = { set_port_mac; }
        default_action = set_port_mac(0);
        size = NPORTS;
    }

    action to_pause_frame() {
        /* A byte-exact 802.3x PAUSE frame: 01:80:C2:00:00:01, 0x8808, opcode 1. */
        hdr.ethernet.setValid();
        hdr.ethernet.dst = 0x0180C2000001;
        hdr.ethernet.src = meta.port_mac;
        hdr.ethernet.etherType = ETHERTYPE_MAC_CONTROL;
        hdr.hold.setInvalid();
        hdr.vlan.setInvalid();
        hdr.mac_control.setValid();
        hdr.mac_control.opcode = MAC_CONTROL_PAUSE;
        hdr.pause.setValid();
        hdr.pause.quanta = meta.quanta;
        hdr.pfc.setInvalid();
        hdr.pad.setValid();
        hdr.pad.zeros = 0;
        hdr.ipv4.setInvalid();
        hdr.tcp.setInvalid();
        hdr.udp.setInvalid();
        truncate(60);
    }

    action to_pfc_frame() {
        /* A byte-exact 802.1Qbb PFC frame: opcode 0x0101, only this class enabled, its
         * quanta in its slot (class 0 first on the wire), the other slots 0. */
        hdr.ethernet.setValid();
        hdr.ethernet.dst = 0x0180C2000001;
        hdr.ethernet.src = meta.port_mac;
        hdr.ethernet.etherType = ETHERTYPE_MAC_CONTROL;
        hdr.hold.setInvalid();
        hdr.vlan.setInvalid();
        hdr.mac_control.setValid();
        hdr.mac_control.opcode = MAC_CONTROL_PFC;
        hdr.pause.setInvalid();
        hdr.pfc.setValid();
        hdr.pfc.class_enable = (bit<16>)1 << meta.qclass;
        hdr.pfc.quanta = ((bit<128>)meta.quanta) << (bit<8>)(16 * (7 - meta.qclass));
        hdr.pad.setValid();
        hdr.pad.zeros = 0;
        hdr.ipv4.setInvalid();
        hdr.tcp.setInvalid();
        hdr.udp.setInvalid();
        truncate(60);
    }

    action to_telemetry_record() {
        bit<32> seq;
        tel_seq.read(seq, 0);
        tel_seq.write(0, seq + 1);
        /* the packet's bytes that follow the report, in 4-byte words */
        bit<32> inner = meta.pkt_len < TELEMETRY_INNER_BYTES ? meta.pkt_len : TELEMETRY_INNER_BYTES;
        hdr.hold.setInvalid();
        hdr.tel_eth.setValid();
        hdr.tel_eth.dst = 0xFFFFFFFFFFFF;
        hdr.tel_eth.src = 0;
        hdr.tel_eth.etherType = ETHERTYPE_IPV4;
        hdr.tel_ipv4.setValid();
        hdr.tel_ipv4.version = 4;
        hdr.tel_ipv4.ihl = 5;
        hdr.tel_ipv4.dscp = 0;
        hdr.tel_ipv4.ecn = 0;
        hdr.tel_ipv4.totalLen = (bit<16>)(20 + 8 + 8 + 12 + 68 + inner);
        hdr.tel_ipv4.identification = 0;
        hdr.tel_ipv4.flags = 2;          /* don't fragment */
        hdr.tel_ipv4.fragOffset = 0;
        hdr.tel_ipv4.ttl = 64;
        hdr.tel_ipv4.protocol = PROTO_UDP;
        hdr.tel_ipv4.srcAddr = TELEMETRY_SRC_NET + (bit<32>)meta.cfg.switch_id[15:0];
        hdr.tel_ipv4.dstAddr = TELEMETRY_COLLECTOR_ADDR;
        hdr.tel_udp.setValid();
        hdr.tel_udp.srcPort = TELEMETRY_UDP_PORT;
        hdr.tel_udp.dstPort = TELEMETRY_UDP_PORT;
        hdr.tel_udp.length = (bit<16>)(8 + 8 + 12 + 68 + inner);
        hdr.tel_udp.checksum = 0;        /* none (IPv4) */
        hdr.tel_group.setValid();
        hdr.tel_group.version = 2;
        hdr.tel_group.hw_id = 0;
        hdr.tel_group.seq = seq[21:0];
        hdr.tel_group.node_id = meta.cfg.switch_id;
        hdr.tel.setValid();
        hdr.tel.rep_type = 1;
        hdr.tel.in_type = 3;
        hdr.tel.rep_len = 2 + INT_MD_WORDS + (bit<8>)((inner + 3) >> 2);
        hdr.tel.md_len = INT_MD_WORDS;
        hdr.tel.dropped = meta.event == EVENT_DROP ? 1w1 : 1w0;
        hdr.tel.congested = 0;
        hdr.tel.tracked_flow = 1;
        hdr.tel.intermediate = 0;
        hdr.tel.rsvd = 0;
        hdr.tel.rep_md_bits = INT_REP_MD_BITS;
        hdr.tel.domain_id = INT_DOMAIN_ID;
        hdr.tel.ds_md_bits = INT_DS_MD_BITS;
        hdr.tel.ds_md_status = 0;
        hdr.tel.ingress_port = meta.in_port;
        hdr.tel.egress_port = meta.out_port;
        hdr.tel.queue = meta.qclass;
        hdr.tel.queue_occupancy = meta.occ_enq > 0xFFFFFF ? 24w0xFFFFFF : meta.occ_enq[23:0];
        /* lab 7 begin: the report's queue state: what the packet found at enqueue and
         * left at dequeue (bmv2's packet depths meta.enq_qdepth/deq_qdepth, the class
         * queue's bytes meta.occ_enq/occ_deq, the port's meta.port_enq/port_deq), its
         * time in the queue (meta.deq_timedelta, into hdr.tel.hop_latency) and both
         * timestamps (meta.enq_ts into hdr.tel.ingress_ts, meta.deq_ts into
         * hdr.tel.egress_ts), into the hdr.tel fields of the same names (occ_*_bytes,
         * port_*_bytes). */
        /* lab 7 stub: hdr.tel.occ_enq_bytes = 0; */
        hdr.tel.enq_qdepth = meta.enq_qdepth;
        hdr.tel.deq_qdepth = meta.deq_qdepth;
        hdr.tel.occ_enq_bytes = meta.occ_enq;
        hdr.tel.occ_deq_bytes = meta.occ_deq;
        hdr.tel.port_enq_bytes = meta.port_enq;
        hdr.tel.port_deq_bytes = meta.port_deq;
        hdr.tel.hop_latency = meta.deq_timedelta;
        hdr.tel.ingress_ts = (bit<64>)meta.enq_ts;
        hdr.tel.egress_ts = (bit<64>)meta.deq_ts;
        /* lab 7 end */
        hdr.tel.pkt_len = meta.pkt_len;
        hdr.tel.flow_hash = meta.flow_hash;
        hdr.tel.saddr = meta.saddr;
        hdr.tel.daddr = meta.daddr;
        truncate(TELEMETRY_FRAME_BYTES);
    }

    /* An XON replica goes only to a port that is paused; it ends that pause. */
    action end_port_pause() {
        bit<48> until;
        pause_until.read(until, meta.pidx);
        pause_until.write(meta.pidx, 0);
        meta.sample = until > std.egress_global_timestamp ? 1w1 : 1w0;
    }

    /* PFC: an XON replica ends the pause of its class at this port, if there is one. */
    action end_class_pause() {
        bit<48> until;
        pfc_until.read(until, meta.qidx);
        pfc_until.write(meta.qidx, 0);
        meta.sample = until > std.egress_global_timestamp ? 1w1 : 1w0;
    }

    /* The packet leaves its class queue: release its bytes. */
    action release() {
        /* lab 5 begin: the packet leaves: take its bytes (meta.pkt_len) off its class
         * queue (occ_bytes[meta.qidx]) and its port (port_bytes[meta.pidx]); set
         * meta.occ_deq and meta.port_deq (after it left). */
        /* lab 5 stub: meta.occ_deq = 0; meta.port_deq = 0; */
        bit<32> occ;
        bit<32> port_occ;
        occ_bytes.read(occ, meta.qidx);
        port_bytes.read(port_occ, meta.pidx);
        occ = occ - meta.pkt_len;
        port_occ = port_occ - meta.pkt_len;
        occ_bytes.write(meta.qidx, occ);
        port_bytes.write(meta.pidx, port_occ);
        meta.occ_deq = occ;
        meta.port_deq = port_occ;
        /* lab 5 end */
    }

    /* The packet's bytes go back to the shared pool (nothing without one). */
    action pool_release() {
        bit<32> used;
        pool_used.read(used, 0);
        pool_used.write(0, meta.cfg.pool_bytes != 0 ? used - meta.pkt_len : used);
    }

    /* A congested port down to XON; the last one sends XON. */
    action note_departure() {
        /* lab 6 begin: a packet left port meta.pidx, whose queues now hold
         * meta.port_deq bytes. A congested port at or below XON (meta.cfg.xon) is
         * congested no more (congested[pidx], congested_ports[0]); if it was the last
         * congested port, the paused ports get XON now (meta.send_xon = 1). */
        /* lab 6 stub: meta.send_xon = 0; */
        bit<1> was_congested;
        bit<32> n;
        congested.read(was_congested, meta.pidx);
        congested_ports.read(n, 0);
        bool fall = was_congested == 1 && meta.port_deq <= meta.cfg.xon;
        congested.write(meta.pidx, fall ? 1w0 : was_congested);
        congested_ports.write(0, fall ? n - 1 : n);
        meta.send_xon = fall && n == 1 ? 1w1 : 1w0;
        /* lab 6 end */
    }

    /* PFC: as note_departure, for the class queue against its own XON. */
    action note_class_departure() {
        bit<1> was_congested;
        bit<32> n;
        bit<32> c = (bit<32>)meta.qclass;
        queue_congested.read(was_congested, meta.qidx);
        congested_queues.read(n, c);
        bool fall = was_congested == 1 && meta.occ_deq <= meta.q.xon;
        queue_congested.write(meta.qidx, fall ? 1w0 : was_congested);
        congested_queues.write(c, fall ? n - 1 : n);
        meta.send_xon = fall && n == 1 ? 1w1 : 1w0;
    }

    action check_paused() {
        bit<48> until;
        rx_until.read(until, meta.qidx);
        meta.sample = until > std.egress_global_timestamp ? 1w1 : 1w0;
    }

    action note_ingress_wait() {
        bit<32> max_us;
        ingress_wait_max_us.read(max_us, 0);
        bit<32> wait_us = std.enq_timestamp - (bit<32>)meta.enq_ts;   /* both us, mod 2^32 */
        ingress_wait_max_us.write(0, wait_us > max_us ? wait_us : max_us);
        meta.sample = wait_us > meta.cfg.late_us ? 1w1 : 1w0;
    }

    action sample_one_in_n() {
        bit<32> count;
        tel_count.read(count, meta.pidx);
        count = count + 1;
        bool hit = count >= meta.cfg.tel_n;
        tel_count.write(meta.pidx, hit ? 32w0 : count);
        meta.sample = hit ? 1w1 : 1w0;
    }

    action sample_on_change() {
        bit<32> delta = meta.cfg.tel_delta;
        bit<32> last_occ;
        tel_last.read(last_occ, meta.qidx);
        bool hit = meta.occ_deq >= last_occ + delta || meta.occ_deq + delta <= last_occ;
        tel_last.write(meta.qidx, hit ? meta.occ_deq : last_occ);
        meta.sample = hit ? 1w1 : 1w0;
    }

    /* Record only packets that found their class queue above the threshold: the
     * postcards of a microburst, nothing of the quiet time between. */
    action sample_above_threshold() {
        /* lab 7 begin: set meta.sample to 1 if the packet found its class queue
         * (meta.occ_enq bytes, itself included) at or above meta.cfg.tel_threshold,
         * else 0. */
        /* lab 7 stub: meta.sample = 0; */
        meta.sample = meta.occ_enq >= meta.cfg.tel_threshold ? 1w1 : 1w0;
        /* lab 7 end */
    }

    apply {
        if (std.egress_port == HOLD_PORT) {
            return;   /* round the hold loop: its bytes stay in its own port's buffer */
        }
        meta.pidx = (bit<32>)std.egress_port;
        meta.qidx = (bit<32>)std.egress_port * 8 + (bit<32>)meta.qclass;
        egress_switch_config.apply();
        if (std.instance_type == 1 || std.instance_type == 2) {   /* I2E or E2E clone */
            if (meta.clone_kind == CLONE_PAUSE) {
                bit<32> pfc_on = meta.cfg.pfc;
                port_config.apply();
                if (meta.quanta == 0) {
                    if (pfc_on != 0) {
                        end_class_pause();
                    } else {
                        end_port_pause();
                    }
                    if (meta.sample == 0) {
                        mark_to_drop(std);
                        return;
                    }
                    xon_port_tx.count(meta.pidx);
                } else {
                    /* A PAUSE replica: not to the congested port (its host only
                     * receives; pausing it would hold back the ACKs). */
                    if (std.egress_port == (bit<9>)meta.out_port) {
                        mark_to_drop(std);
                        return;
                    }
                    bit<48> pause_us = (bit<48>)meta.cfg.pause_us;
                    if (pfc_on != 0) {
                        pfc_until.write(meta.qidx, std.egress_global_timestamp + pause_us);
                    } else {
                        pause_until.write(meta.pidx, std.egress_global_timestamp + pause_us);
                    }
                    pause_port_tx.count(meta.pidx);
                }
                if (pfc_on != 0) {
                    to_pfc_frame();
                } else {
                    to_pause_frame();
                }
            } else {
                to_telemetry_record();
            }
            return;
        }
        if (std.instance_type == 5 && std.egress_port == std.ingress_port) {
            mark_to_drop(std);   /* a flood does not go back where it came from */
            return;
        }
        if (meta.accounted == 0) {
            return;
        }

        release();
        pool_release();
        tx.count(meta.qidx);
        check_paused();
        if (meta.sample == 1) {
            sent_while_paused.count(meta.qidx);
        }
        note_ingress_wait();
        if (meta.sample == 1) {
            ingress_late.count(0);
        }
        meta.event = EVENT_DEQUEUE;
        meta.enq_qdepth = (bit<32>)std.enq_qdepth;
        meta.deq_qdepth = (bit<32>)std.deq_qdepth;
        meta.deq_timedelta = std.deq_timedelta;
        meta.deq_ts = std.egress_global_timestamp;

        bool cloned = false;
        if (meta.cfg.pause_on != 0) {
            if (meta.cfg.pfc != 0) {
                egress_queue_config.apply();
                note_class_departure();
            } else {
                note_departure();
            }
            if (meta.send_xon == 1) {
                /* One clone to multicast group 2: quanta 0 to every paused port. */
                meta.clone_kind = CLONE_PAUSE;
                meta.quanta = 0;
                xon_tx.count(meta.pidx);
                clone_preserving_field_list(CloneType.E2E, PAUSE_MC_SESSION, FL_CLONE);
                cloned = true;
            }
        }

        /* Telemetry sampling. */
        bit<32> mode = meta.cfg.tel_mode;
        meta.sample = 0;
        if (mode == (bit<32>)TEL_ALL) {
            meta.sample = 1;
        } else if (mode == (bit<32>)TEL_ONE_IN_N) {
            sample_one_in_n();
        } else if (mode == (bit<32>)TEL_ON_CHANGE) {
            sample_on_change();
        } else if (mode == (bit<32>)TEL_ABOVE) {
            sample_above_threshold();
        }
        if (meta.sample == 1) {
            if (cloned) {
                telemetry_suppressed.count(0);   /* the PAUSE clone took this packet's clone */
            } else {
                meta.clone_kind = CLONE_TELEMETRY;
                clone_preserving_field_list(CloneType.E2E, TELEMETRY_SESSION, FL_CLONE);
            }
        }
    }
}

control IncastComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        /* Only a header this switch changed (an ECN mark; options-free, as the hosts
         * send them) gets a new checksum: any other is forwarded as it came. */
        update_checksum(meta.ecn_marked == 1 && hdr.ipv4.isValid() && hdr.ipv4.ihl == 5,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
        update_checksum(hdr.tel_ipv4.isValid(),
            { hdr.tel_ipv4.version, hdr.tel_ipv4.ihl, hdr.tel_ipv4.dscp, hdr.tel_ipv4.ecn,
              hdr.tel_ipv4.totalLen, hdr.tel_ipv4.identification, hdr.tel_ipv4.flags,
              hdr.tel_ipv4.fragOffset, hdr.tel_ipv4.ttl, hdr.tel_ipv4.protocol,
              hdr.tel_ipv4.srcAddr, hdr.tel_ipv4.dstAddr },
            hdr.tel_ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control IncastDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.hold);
        pkt.emit(hdr.tel_eth);
        pkt.emit(hdr.tel_ipv4);
        pkt.emit(hdr.tel_udp);
        pkt.emit(hdr.tel_group);
        pkt.emit(hdr.tel);
        pkt.emit(hdr.ethernet);
        pkt.emit(hdr.vlan);
        pkt.emit(hdr.mac_control);
        pkt.emit(hdr.pause);
        pkt.emit(hdr.pfc);
        pkt.emit(hdr.pad);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.tcp);
        pkt.emit(hdr.udp);
    }
}

V1Switch(IncastParser(), IncastVerifyChecksum(), IncastIngress(), IncastEgress(),
         IncastComputeChecksum(), IncastDeparser()) main;
