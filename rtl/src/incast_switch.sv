// incast_switch: an N-port output-queued Ethernet switch with the semantics of
// p4src/incast.p4, cycle by cycle.
//
//   port_rx (xN) -> forwarding pipeline -> shared cell buffer -> read engine -> port_tx (xN)
//                                   \-> telemetry postcards -> collector port
//
// - Ports move LW bytes a cycle (1 Gbit/s: LW=1 at 125 MHz; 10 Gbit/s: LW=8 at 156.25 MHz)
//   and keep the wire's timing (port_tx adds FCS, padding, preamble and gap).
// - The core moves CW bytes a cycle; the buffer is NCELLS cells of CW bytes, one per
//   word of a frame, linked per queue (a queue per (egress port, class), 8 classes).
//   The core must be faster than the ports together (CW >= about NPORTS * LW), as in
//   a shared-memory switch: then queueing happens only in the buffer (output queueing).
// - Admission is byte-accurate, per (port, class), against `limit` (the static buffer),
//   and, with dynamic thresholds on, against alpha times the free shared pool.
// - Classes come from the DSCP (or 802.1Q PCP) maps; class 0 is served first (strict
//   priority), as incast.p4 maps class c to bmv2's priority queue 7 - c.
// - 802.3x PAUSE (or 802.1Qbb PFC per class) is sent to every other port when a port's
//   (class queue's) bytes pass XOFF, refreshed while above it, and XON (quanta 0) when
//   the last congested port (queue) falls to XON. PAUSE/PFC received is obeyed: a port
//   starts no frame of a paused class.
// - ECN: an ECN-capable IPv4 packet that finds more than ecn_k bytes in its class queue
//   leaves marked CE, its header checksum updated.
// - Telemetry: a postcard for each sampled departure and each drop: an INT telemetry
//   report as incast.p4 sends it (Telemetry Report Format v2.0 over UDP: group header,
//   individual report with its metadata, then the packet's first 56 bytes).
//
// Time is a cycle counter, `now`; deadlines are compared against it, so a simulation
// may jump it forward over idle time (skip_*) without changing what happens (`quiet`
// says nothing moves before `wake`, or before a frame arrives).
module incast_switch #(
    parameter int NPORTS = 4,
    parameter int LW = 1,
    parameter int CW = 8,
    parameter int CELL_AW = 12,           // NCELLS = 2**CELL_AW cells of CW bytes
    parameter int RX_AW = 9,              // each port's receive memory, in words
    parameter int TX_AW = 9,              // each port's transmit FIFO, in words
    parameter int MAXLEN = 2048,          // longest frame taken (bytes, without FCS)
    parameter int NMAC = 16,              // forwarding table entries
    parameter int PS_PER_CYCLE = 8000,    // clock period, for telemetry's microseconds
    parameter bit STATS = 1'b1            // per-queue packet/drop/mark counters
) (
    input  logic                   clk,
    input  logic                   rst,
    input  logic                   skip_valid,
    input  logic [31:0]            skip_cycles,
    output logic [47:0]            now,
    output logic                   quiet,
    output logic [47:0]            wake,
    input  logic [NPORTS-1:0]      rx_valid,
    input  logic [NPORTS*LW*8-1:0] rx_data,
    input  logic [NPORTS*LW-1:0]   rx_keep,
    input  logic [NPORTS-1:0]      rx_last,
    output logic [NPORTS-1:0]      tx_valid,
    output logic [NPORTS*LW*8-1:0] tx_data,
    output logic [NPORTS*LW-1:0]   tx_keep,
    output logic [NPORTS-1:0]      tx_last,
    output logic                   tel_valid,
    output logic [LW*8-1:0]        tel_data,
    output logic [LW-1:0]          tel_keep,
    output logic                   tel_last,
    input  logic                   mgmt_we,
    input  logic [15:0]            mgmt_addr,
    input  logic [31:0]            mgmt_wdata,
    output logic [31:0]            mgmt_rdata,
    // for cycle-level checks
    output logic [31:0]            pool_bytes,   // bytes admitted and not yet departed
    output logic [CELL_AW:0]       cells_used
);
    localparam int PW = $clog2(NPORTS);   // NPORTS >= 2
    localparam int QW = PW + 3;
    localparam int NQ = NPORTS * 8;
    localparam int NCELLS = 1 << CELL_AW;
    localparam int MAXW = (MAXLEN + CW - 1) / CW;
    localparam int HDRW = (64 + CW - 1) / CW;      // words holding the first 64 bytes
    localparam int BW = $clog2(CW + 1);
    localparam int TEL_HDR = 56;                   // packet bytes after the report
    localparam int TEL_REC = 14 + 20 + 8 + 8 + 80; // Ethernet, IPv4, UDP, group header, report
    localparam int TEL_ENTRY = (TEL_REC + TEL_HDR) * 8 + 8;
    // Microseconds per cycle, fixed point (32 fraction bits): telemetry's time unit.
    localparam logic [31:0] US_MUL = 32'((64'(PS_PER_CYCLE) << 32) / 64'd1000000 + 64'd1);

    // Configuration register indexes: those of incast.p4's cfg, times in cycles.
    localparam int CFG_SWITCH_ID = 0, CFG_PAUSE_ON = 1, CFG_XOFF = 2, CFG_XON = 3, CFG_QUANTA = 4,
                   CFG_PAUSE_CYCLES = 5, CFG_REFRESH_CYCLES = 6, CFG_TEL_MODE = 7, CFG_TEL_N = 8,
                   CFG_TEL_THRESHOLD = 9, CFG_TEL_DELTA = 10, CFG_ECN_K = 12, CFG_PFC = 13,
                   CFG_OBEY = 14, CFG_QUANTUM = 15, CFG_POOL_BYTES = 16, CFG_POOL_ALPHA16 = 17,
                   CFG_US_MUL = 24;

    // The management port's address map (incast.dataplane.rtl reads these names from
    // here): a region's base, plus a port's, an entry's, a code point's or a queue's index.
    localparam logic [15:0] ADDR_PORT_MAC = 16'h0100, ADDR_MAC_TABLE = 16'h0400, ADDR_DSCP_MAP = 16'h0600,
                            ADDR_PCP_MAP = 16'h0640, ADDR_LIMIT = 16'h1000, ADDR_XOFF_Q = 16'h2000,
                            ADDR_XON_Q = 16'h3000, ADDR_OCC = 16'h4000, ADDR_QUEUE_PKTS = 16'h5000,
                            ADDR_DROPS = 16'h6000, ADDR_DROP_BYTES = 16'h7000, ADDR_TX_PKTS = 16'h8000,
                            ADDR_TX_BYTES = 16'h9000, ADDR_ECN = 16'hA000, ADDR_PORT_STATS = 16'hB000,
                            ADDR_CONGESTED = 16'hC000, ADDR_SWITCH_STATS = 16'hD000;

    if (NPORTS < 2 || CW % LW != 0 || CW < LW) begin : g_bad_parameters
        $error("incast_switch: NPORTS >= 2, and CW a multiple of LW");
    end

    // ------------------------------------------------------------------ time
    always_ff @(posedge clk)
        if (rst) now <= '0;
        else now <= now + 48'd1 + (skip_valid ? {16'd0, skip_cycles} : 48'd0);

    logic [31:0] cfg_us_mul;
    logic [31:0] cfg_quantum;   // a pause quantum in cycles: 512 bit times at the ports' rate
    function automatic logic [47:0] to_us(input logic [47:0] cycles, input logic [31:0] mul);
        /* verilator lint_off UNUSEDSIGNAL */
        logic [79:0] p;   // cycles * 2**32 * the period in us: the fraction is dropped
        /* verilator lint_on UNUSEDSIGNAL */
        p = {32'd0, cycles} * {48'd0, mul};
        to_us = p[79:32];
    endfunction

    // -------------------------------------------------------- configuration
    logic [31:0] cfg_switch_id, cfg_xoff, cfg_xon, cfg_pause_cycles, cfg_refresh_cycles;
    logic [31:0] cfg_tel_n, cfg_tel_threshold, cfg_tel_delta, cfg_ecn_k, cfg_pool_bytes;
    logic [15:0] cfg_quanta;
    logic [7:0]  cfg_pool_alpha16;
    logic [2:0]  cfg_tel_mode;
    logic        cfg_pause_on, cfg_pfc, cfg_obey;
    logic [31:0] limit_bytes [NQ];
    logic [31:0] xoff_bytes [NQ];
    logic [31:0] xon_bytes [NQ];
    logic [47:0] port_mac [NPORTS];
    logic [31:0] shaper [NPORTS];
    logic [47:0] fwd_mac [NMAC];
    logic [PW-1:0] fwd_port [NMAC];
    logic [NMAC-1:0] fwd_valid;
    logic [2:0]  dscp_class [64];
    logic [63:0] dscp_valid;
    logic [2:0]  pcp_class [8];
    logic [7:0]  pcp_valid;
    localparam int EW = NMAC > 1 ? $clog2(NMAC) : 1;
    wire [15:0]  port_off = mgmt_addr - ADDR_PORT_MAC;     // 4 a port: MAC low, MAC high, shaper
    wire [15:0]  entry_off = mgmt_addr - ADDR_MAC_TABLE;   // 2 an entry

    always_ff @(posedge clk) begin
        if (rst) begin
            cfg_switch_id <= '0; cfg_pause_on <= 1'b0; cfg_xoff <= '0; cfg_xon <= '0;
            cfg_quanta <= '0; cfg_pause_cycles <= '0; cfg_refresh_cycles <= '0; cfg_tel_mode <= '0;
            cfg_tel_n <= 32'd1; cfg_tel_threshold <= '0; cfg_tel_delta <= '0; cfg_ecn_k <= '0;
            cfg_pfc <= 1'b0; cfg_obey <= 1'b0; cfg_pool_bytes <= '0; cfg_pool_alpha16 <= 8'd16;
            cfg_us_mul <= US_MUL; cfg_quantum <= 32'(64 / LW);
            fwd_valid <= '0; dscp_valid <= '0; pcp_valid <= '0;
            for (int q = 0; q < NQ; q++) begin
                limit_bytes[q] <= '0; xoff_bytes[q] <= '1; xon_bytes[q] <= '0;
            end
            for (int p = 0; p < NPORTS; p++) begin
                port_mac[p] <= '0; shaper[p] <= '0;
            end
        end else if (mgmt_we) begin
            if (mgmt_addr[15:5] == 11'd0)
                case (32'(mgmt_addr[4:0]))
                    CFG_SWITCH_ID: cfg_switch_id <= mgmt_wdata;
                    CFG_PAUSE_ON: cfg_pause_on <= mgmt_wdata != 0;
                    CFG_XOFF: cfg_xoff <= mgmt_wdata;
                    CFG_XON: cfg_xon <= mgmt_wdata;
                    CFG_QUANTA: cfg_quanta <= mgmt_wdata[15:0];
                    CFG_PAUSE_CYCLES: cfg_pause_cycles <= mgmt_wdata;
                    CFG_REFRESH_CYCLES: cfg_refresh_cycles <= mgmt_wdata;
                    CFG_TEL_MODE: cfg_tel_mode <= mgmt_wdata[2:0];
                    CFG_TEL_N: cfg_tel_n <= mgmt_wdata;
                    CFG_TEL_THRESHOLD: cfg_tel_threshold <= mgmt_wdata;
                    CFG_TEL_DELTA: cfg_tel_delta <= mgmt_wdata;
                    CFG_ECN_K: cfg_ecn_k <= mgmt_wdata;
                    CFG_PFC: cfg_pfc <= mgmt_wdata != 0;
                    CFG_OBEY: cfg_obey <= mgmt_wdata != 0;
                    CFG_POOL_BYTES: cfg_pool_bytes <= mgmt_wdata;
                    CFG_POOL_ALPHA16: cfg_pool_alpha16 <= mgmt_wdata[7:0];
                    CFG_QUANTUM: cfg_quantum <= mgmt_wdata;
                    CFG_US_MUL: cfg_us_mul <= mgmt_wdata;   // the clock the ports run at
                    default: ;
                endcase
            // One indexed write a region, at the address's offset from its base: in
            // simulation a loop comparing the address with every entry's costs every cycle,
            // each entry's write prepared and tested whether it happens or not.
            if (mgmt_addr >= ADDR_PORT_MAC && port_off < 16'(NPORTS * 4))
                case (port_off[1:0])
                    2'd0: port_mac[port_off[2 +: PW]][31:0] <= mgmt_wdata;
                    2'd1: port_mac[port_off[2 +: PW]][47:32] <= mgmt_wdata[15:0];
                    2'd2: shaper[port_off[2 +: PW]] <= mgmt_wdata;
                    default: ;
                endcase
            if (mgmt_addr >= ADDR_MAC_TABLE && entry_off < 16'(NMAC * 2)) begin
                if (!entry_off[0]) fwd_mac[entry_off[1 +: EW]][31:0] <= mgmt_wdata;
                else begin
                    fwd_mac[entry_off[1 +: EW]][47:32] <= mgmt_wdata[15:0];
                    fwd_port[entry_off[1 +: EW]] <= mgmt_wdata[16 +: PW];
                    fwd_valid[entry_off[1 +: EW]] <= mgmt_wdata[31];
                end
            end
            if (mgmt_addr >= ADDR_DSCP_MAP && mgmt_addr - ADDR_DSCP_MAP < 16'd64) begin
                dscp_class[6'(mgmt_addr - ADDR_DSCP_MAP)] <= mgmt_wdata[2:0];
                dscp_valid[6'(mgmt_addr - ADDR_DSCP_MAP)] <= mgmt_wdata[8];
            end
            if (mgmt_addr >= ADDR_PCP_MAP && mgmt_addr - ADDR_PCP_MAP < 16'd8) begin
                pcp_class[3'(mgmt_addr - ADDR_PCP_MAP)] <= mgmt_wdata[2:0];
                pcp_valid[3'(mgmt_addr - ADDR_PCP_MAP)] <= mgmt_wdata[8];
            end
            if (mgmt_addr >= ADDR_LIMIT && mgmt_addr - ADDR_LIMIT < 16'(NQ))
                limit_bytes[QW'(mgmt_addr - ADDR_LIMIT)] <= mgmt_wdata;
            if (mgmt_addr >= ADDR_XOFF_Q && mgmt_addr - ADDR_XOFF_Q < 16'(NQ))
                xoff_bytes[QW'(mgmt_addr - ADDR_XOFF_Q)] <= mgmt_wdata;
            if (mgmt_addr >= ADDR_XON_Q && mgmt_addr - ADDR_XON_Q < 16'(NQ))
                xon_bytes[QW'(mgmt_addr - ADDR_XON_Q)] <= mgmt_wdata;
        end
    end

    // ----------------------------------------------------------------- ports
    logic [NPORTS-1:0]  info_valid;
    logic [15:0]        info_len [NPORTS];
    logic [RX_AW-1:0]   rd_off;
    logic [NPORTS-1:0]  rd_en;       // the receive memory the pipeline reads now
    logic [CW*8-1:0]    rx_word [NPORTS];
    logic [NPORTS-1:0]  release_frame;
    logic [NPORTS-1:0]  ctl_rx_valid, rx_error, rx_holding;
    logic [7:0]         ctl_rx_enable [NPORTS];
    logic [127:0]       ctl_rx_quanta [NPORTS];
    logic [NPORTS-1:0]  txw_valid;
    logic [CW*8-1:0]    txw_data;
    logic               txw_last;
    logic [BW-1:0]      txw_bytes;
    logic [TX_AW:0]     tx_words [NPORTS];
    logic [NPORTS-1:0]  tx_want;
    logic [7:0]         ctl_xoff [NPORTS];
    logic [7:0]         ctl_xon [NPORTS];
    logic [7:0]         paused [NPORTS];
    logic [NPORTS-1:0]  sent_xoff, sent_xon, tx_active;
    logic [47:0]        tx_wake [NPORTS];
    logic [47:0]        tx_wake_next [NPORTS];

    for (genvar p = 0; p < NPORTS; p++) begin : g_port
        port_rx #(.LW(LW), .CW(CW), .AW(RX_AW), .MAXLEN(MAXLEN)) rx (
            .clk, .rst, .rx_valid(rx_valid[p]), .rx_data(rx_data[p*LW*8 +: LW*8]),
            .rx_keep(rx_keep[p*LW +: LW]), .rx_last(rx_last[p]),
            .info_valid(info_valid[p]), .info_len(info_len[p]), .rd_en(rd_en[p]), .rd_off, .rd_data(rx_word[p]),
            .release_frame(release_frame[p]), .ctl_valid(ctl_rx_valid[p]), .ctl_enable(ctl_rx_enable[p]),
            .ctl_quanta(ctl_rx_quanta[p]), .rx_error(rx_error[p]), .holding(rx_holding[p]));
        port_tx #(.LW(LW), .CW(CW), .AW(TX_AW), .LEAD(MAXW + 4)) tx (
            .clk, .rst, .now, .wr_valid(txw_valid[p]), .wr_data(txw_data), .wr_last(txw_last),
            .wr_bytes(txw_bytes), .fifo_words(tx_words[p]), .want_next(tx_want[p]), .quantum_cycles(cfg_quantum), .ctl_xoff(ctl_xoff[p]), .ctl_xon(ctl_xon[p]),
            .cfg_pfc, .cfg_quanta, .mac(port_mac[p]), .cfg_shaper(shaper[p]),
            .obey_valid(ctl_rx_valid[p] && cfg_obey), .obey_enable(ctl_rx_enable[p]),
            .obey_quanta(ctl_rx_quanta[p]), .paused(paused[p]),
            .tx_valid(tx_valid[p]), .tx_data(tx_data[p*LW*8 +: LW*8]), .tx_keep(tx_keep[p*LW +: LW]),
            .tx_last(tx_last[p]), .sent_xoff(sent_xoff[p]), .sent_xon(sent_xon[p]),
            .active(tx_active[p]), .wake(tx_wake[p]), .wake_next(tx_wake_next[p]));
    end

    // ---------------------------------------------------------------- buffer
    // Cell data, the link from each cell to the next of its queue, and each frame's
    // descriptor (kept at its first cell). One write port (the pipeline) and one read
    // port (the read engine) each: simple dual-port block RAM.
    localparam int DESC_W = 16 + PW + 48 + 32 + 32 + 16 + 32 + 32 + 32 + 1;
    logic [CW*8-1:0]    cell_data [NCELLS];
    logic [CELL_AW-1:0] cell_next [NCELLS];
    logic [DESC_W-1:0]  desc_mem [NCELLS];

    logic               cw_en;       // pipeline: write cell data
    logic [CELL_AW-1:0] cw_addr;
    logic [CW*8-1:0]    cw_data;
    logic               nw_en;       // pipeline: write a link
    logic [CELL_AW-1:0] nw_addr, nw_data;
    logic               dw_en;
    logic [CELL_AW-1:0] dw_addr;
    logic [DESC_W-1:0]  dw_data;
    logic [CELL_AW-1:0] rd_cell;     // read engine: cell to read (all three memories)
    logic [CW*8-1:0]    rd_cell_data;
    logic [CELL_AW-1:0] rd_cell_next;
    logic [DESC_W-1:0]  rd_desc;

    always_ff @(posedge clk) begin
        if (cw_en) cell_data[cw_addr] <= cw_data;
        if (nw_en) cell_next[nw_addr] <= nw_data;
        if (dw_en) desc_mem[dw_addr] <= dw_data;
        rd_cell_data <= cell_data[rd_cell];
        // A link written in the cycle it is read is read as written.
        rd_cell_next <= (nw_en && nw_addr == rd_cell) ? nw_data : cell_next[rd_cell];
        rd_desc <= desc_mem[rd_cell];
    end

    // Free cells: never used ones first (fresh), then those returned, in a FIFO.
    logic [CELL_AW:0]   fresh;
    logic               free_push, free_pop;
    /* verilator lint_off UNUSEDSIGNAL */
    // Never empty when a cell is taken, nor full when one is returned: the pipeline
    // admits a frame only while two cells more than it needs are free.
    logic               free_valid, free_full_unused;
    /* verilator lint_on UNUSEDSIGNAL */
    logic [CELL_AW-1:0] free_in, free_head;
    /* verilator lint_off UNUSEDSIGNAL */
    logic [CELL_AW:0]   free_count;
    /* verilator lint_on UNUSEDSIGNAL */
    sync_fifo #(.W(CELL_AW), .AW(CELL_AW)) free_cells (
        .clk, .rst, .push(free_push), .din(free_in), .pop(free_pop), .dout(free_head),
        .valid(free_valid), .full(free_full_unused), .count(free_count));
    logic               alloc;
    wire  [CELL_AW-1:0] alloc_cell = fresh[CELL_AW] ? free_head : fresh[CELL_AW-1:0];
    assign free_pop = alloc && fresh[CELL_AW];
    always_ff @(posedge clk)
        if (rst) begin
            fresh <= '0;
            cells_used <= '0;
        end else begin
            if (alloc && !fresh[CELL_AW]) fresh <= fresh + 1'b1;
            cells_used <= cells_used + {{CELL_AW{1'b0}}, alloc} - {{CELL_AW{1'b0}}, free_push};
        end

    // ------------------------------------------------------------ queue state
    logic [CELL_AW-1:0] q_head [NQ];
    logic [CELL_AW-1:0] q_tail [NQ];
    logic [15:0]        q_pkts [NQ];
    // Which queues hold a frame (q_pkts != 0), as one vector: the read engine and the
    // idle test look at its bits instead of every queue's counter, which in simulation
    // is work for every cycle.
    logic [NQ-1:0]      q_busy;
    logic [31:0]        occ [NQ];
    logic [31:0]        port_bytes [NPORTS];
    logic [31:0]        pool_max;    // the most pool_bytes has been

    // From the pipeline: admission (bytes) and commit (a frame joins its queue).
    logic               adm_valid;
    logic [QW-1:0]      adm_q;
    logic [31:0]        adm_len;
    logic               com_valid;
    logic [QW-1:0]      com_q;
    logic [CELL_AW-1:0] com_first, com_last;
    // From the read engine: a frame left its queue (fin), its bytes are released (rel).
    logic               fin_valid;
    logic [QW-1:0]      fin_q;
    logic [CELL_AW-1:0] fin_next;
    logic               rel_valid;
    logic [31:0]        rel_len;

    wire [15:0] com_pkts_left = q_pkts[com_q] - {15'd0, fin_valid && fin_q == com_q};
    always_comb begin
        nw_en = 1'b0;
        nw_addr = '0;
        nw_data = '0;
        if (com_valid && com_pkts_left != 0) begin   // behind the queue's last frame
            nw_en = 1'b1;
            nw_addr = q_tail[com_q];
            nw_data = com_first;
        end else if (cw_en && cp_idx != 0) begin     // behind the frame's previous cell
            nw_en = 1'b1;
            nw_addr = cp_prev;
            nw_data = cw_addr;
        end
    end

    always_ff @(posedge clk) begin
        if (rst) begin
            for (int q = 0; q < NQ; q++) begin
                q_pkts[q] <= '0; occ[q] <= '0; q_head[q] <= '0; q_tail[q] <= '0;
            end
            for (int p = 0; p < NPORTS; p++) port_bytes[p] <= '0;
            q_busy <= '0;
            pool_bytes <= '0;
            pool_max <= '0;
        end else begin
            // Only the queues an event names change (indexed writes: no loop over all
            // queues, which costs the simulation more than the hardware).
            logic same_q, same_p;
            same_q = com_valid && fin_valid && com_q == fin_q;
            if (fin_valid && !same_q) begin
                q_pkts[fin_q] <= q_pkts[fin_q] - 16'd1;
                q_busy[fin_q] <= q_pkts[fin_q] != 16'd1;
                if (q_pkts[fin_q] >= 16'd2) q_head[fin_q] <= fin_next;
            end
            if (com_valid) begin
                q_pkts[com_q] <= q_pkts[com_q] + 16'd1 - {15'd0, same_q};
                q_busy[com_q] <= q_pkts[com_q] + 16'd1 - {15'd0, same_q} != 16'd0;
                if (same_q && q_pkts[com_q] >= 16'd2) q_head[com_q] <= fin_next;
                if (com_pkts_left == 16'd0) q_head[com_q] <= com_first;
                q_tail[com_q] <= com_last;
            end
            same_q = adm_valid && rel_valid && adm_q == fin_q;
            if (rel_valid && !same_q) occ[fin_q] <= occ[fin_q] - rel_len;
            if (adm_valid) occ[adm_q] <= occ[adm_q] + adm_len - (same_q ? rel_len : 32'd0);
            same_p = adm_valid && rel_valid && adm_q[QW-1:3] == fin_q[QW-1:3];
            if (rel_valid && !same_p) port_bytes[fin_q[QW-1:3]] <= port_bytes[fin_q[QW-1:3]] - rel_len;
            if (adm_valid)
                port_bytes[adm_q[QW-1:3]] <= port_bytes[adm_q[QW-1:3]] + adm_len - (same_p ? rel_len : 32'd0);
            pool_bytes <= pool_bytes + (adm_valid ? adm_len : 32'd0) - (rel_valid ? rel_len : 32'd0);
            if (pool_bytes > pool_max) pool_max <= pool_bytes;
        end
    end

    // The first set bit of v after `last`, in turn (last + 1, ..., NPORTS - 1, 0, ...,
    // last): the round robin of the pipeline over ports and of the read engine. v != 0.
    function automatic logic [PW-1:0] rr_next(input logic [NPORTS-1:0] v, input logic [PW-1:0] last);
        logic [PW-1:0] r;
        logic found;
        r = '0;
        found = 1'b0;
        for (int p = NPORTS - 1; p >= 0; p--)
            if (v[p] && PW'(p) > last) begin
                r = PW'(p);
                found = 1'b1;
            end
        if (!found)
            for (int p = NPORTS - 1; p >= 0; p--)
                if (v[p]) r = PW'(p);
        rr_next = r;
    endfunction

    // ------------------------------------------------------ forwarding pipeline
    typedef enum logic [3:0] {S_IDLE, S_HDR, S_DEC1, S_DEC2, S_COPY, S_LINK, S_FLOOD, S_DONE} pstate_t;
    pstate_t            ps;
    logic [PW-1:0]      sel, rr_in;
    logic [15:0]        flen;
    logic [15:0]        fwords;
    logic [64*8-1:0]    sh;          // the frame's first 64 bytes
    logic [RX_AW-1:0]   iss;         // next word to read from the receive memory
    logic               ret_v;       // a word read last cycle is here now
    logic [RX_AW-1:0]   ret_idx;
    logic [15:0]        cp_idx;      // next word to place in a cell
    logic [CELL_AW-1:0] cp_prev, cp_first;

    function automatic logic [7:0] shb(input logic [64*8-1:0] s, input int i);
        shb = s[i*8 +: 8];
    endfunction
    function automatic logic [15:0] sh16(input logic [64*8-1:0] s, input int i);
        sh16 = {s[i*8 +: 8], s[(i + 1)*8 +: 8]};
    endfunction
    function automatic logic [31:0] sh32(input logic [64*8-1:0] s, input int i);
        sh32 = {s[i*8 +: 8], s[(i + 1)*8 +: 8], s[(i + 2)*8 +: 8], s[(i + 3)*8 +: 8]};
    endfunction
    // CRC-32 (IEEE 802.3, reflected, as bmv2's crc32) of 13 bytes, first byte in 103:96.
    function automatic logic [31:0] crc32_13(input logic [103:0] bytes);
        logic [31:0] c;
        c = 32'hFFFFFFFF;
        for (int i = 12; i >= 0; i--) begin
            c = c ^ {24'd0, bytes[i*8 +: 8]};
            for (int k = 0; k < 8; k++) c = c[0] ? (c >> 1) ^ 32'hEDB88320 : c >> 1;
        end
        crc32_13 = ~c;
    endfunction

    // Parse (combinational, from sh).
    logic [47:0] p_dst;
    logic        p_vlan, p_ipv4, p_l4, p_ect, p_ihl5;
    logic [4:0]  p_ip_off;
    logic [2:0]  p_class;
    logic [31:0] p_saddr, p_daddr;
    logic [103:0] p_flow;         // the 5-tuple the flow hash covers (0: not TCP/UDP)
    logic [15:0] p_newck;
    logic        p_hit;
    logic [PW-1:0] p_port;
    always_comb begin
        int ip, l4;
        logic [15:0] ckw, oldw, neww;
        logic [16:0] s1;
        /* verilator lint_off UNUSEDSIGNAL */
        logic [7:0] tci, tos;   // the bytes holding PCP and DSCP
        /* verilator lint_on UNUSEDSIGNAL */
        logic [2:0] pcp;
        logic [5:0] dscp;
        // Only in the state that takes the result (S_DEC1): in simulation a block like
        // this one is evaluated every cycle, and the lookup is NMAC compares.
        {p_dst, p_vlan, p_ipv4, p_l4, p_ect, p_ihl5, p_ip_off, p_class} = '0;
        {p_saddr, p_daddr, p_flow, p_newck, p_hit, p_port} = '0;
        {ip, l4, ckw, oldw, neww, s1, tci, tos, pcp, dscp} = '0;
        if (ps == S_DEC1) begin
            p_dst = {shb(sh, 0), shb(sh, 1), shb(sh, 2), shb(sh, 3), shb(sh, 4), shb(sh, 5)};
            p_vlan = sh16(sh, 12) == 16'h8100 && flen >= 16'd18;
            ip = p_vlan ? 18 : 14;
            l4 = ip + 20;
            p_ip_off = 5'(ip);
            p_ipv4 = sh16(sh, ip - 2) == 16'h0800 && flen >= 16'(ip + 20);
            p_ihl5 = shb(sh, ip) == 8'h45;
            p_ect = (shb(sh, ip + 1) & 8'h03) != 8'h00;
            p_saddr = p_ipv4 ? sh32(sh, ip + 12) : 32'd0;
            p_daddr = p_ipv4 ? sh32(sh, ip + 16) : 32'd0;
            p_l4 = p_ipv4 && ((shb(sh, ip + 9) == 8'd6 && flen >= 16'(l4 + 20)) ||
                              (shb(sh, ip + 9) == 8'd17 && flen >= 16'(l4 + 8)));
            p_flow = p_l4 ? {sh32(sh, ip + 12), sh32(sh, ip + 16), shb(sh, ip + 9), sh32(sh, l4)} : 104'd0;
            // RFC 1624: HC' = ~(~HC + ~m + m'), m the 16-bit word holding the TOS byte
            ckw = sh16(sh, ip + 10);
            oldw = sh16(sh, ip);
            neww = oldw | 16'h0003;
            s1 = {1'b0, ~ckw} + {1'b0, ~oldw};
            s1 = {1'b0, s1[15:0]} + {16'd0, s1[16]};
            s1 = {1'b0, s1[15:0]} + {1'b0, neww};
            s1 = {1'b0, s1[15:0]} + {16'd0, s1[16]};
            p_newck = ~s1[15:0];
            p_class = 3'd0;
            tci = shb(sh, 14);
            tos = shb(sh, ip + 1);
            pcp = tci[7:5];
            dscp = tos[7:2];
            if (p_vlan && pcp_valid[pcp]) p_class = pcp_class[pcp];
            if (p_ipv4 && dscp_valid[dscp]) p_class = dscp_class[dscp];
            for (int e = NMAC - 1; e >= 0; e--)
                if (fwd_valid[e] && fwd_mac[e] == p_dst && 32'(fwd_port[e]) < NPORTS) begin
                    p_hit = 1'b1;
                    p_port = fwd_port[e];
                end
        end
    end

    // Decisions (DEC1 -> registers; DEC2 admits).
    logic          d_hit, d_ipv4, d_ect, d_ihl5;
    logic [PW-1:0] d_port;
    logic [2:0]    d_class;
    logic [4:0]    d_ip_off;
    logic [31:0]   d_saddr, d_daddr, d_hash;
    logic [15:0]   d_newck;
    logic          d_mark, d_acc;
    logic [31:0]   d_occ_enq, d_port_enq;
    logic [15:0]   d_qdepth;
    logic [47:0]   d_enq;
    logic [NPORTS-1:0] flood_left;

    wire [QW-1:0] d_q = {d_port, d_class};
    wire [31:0]   d_occ = occ[d_q];
    wire [31:0]   d_len = {16'd0, flen};
    wire [CELL_AW:0] cells_free = (CELL_AW+1)'(NCELLS) - cells_used;
    wire          cells_ok = {{(32-CELL_AW-1){1'b0}}, cells_free} >= {16'd0, fwords} + 32'd2;
    // A shared pool (cfg_pool_bytes, 0: none) with a dynamic threshold: a queue may hold,
    // with the frame, alpha times the pool's free bytes (alpha in sixteenths), as
    // incast.p4's pool_check.
    wire [31:0]   pool_free = cfg_pool_bytes > pool_bytes ? cfg_pool_bytes - pool_bytes : 32'd0;
    wire [39:0]   dt_prod = {8'd0, pool_free} * {32'd0, cfg_pool_alpha16};
    wire [39:0]   dt_limit = dt_prod >> 4;
    wire          dt_ok = cfg_pool_bytes == 0 || ({8'd0, d_occ} + {8'd0, d_len} <= dt_limit
                                                  && pool_bytes + d_len <= cfg_pool_bytes);
    wire          admit_ok = d_occ + d_len <= limit_bytes[d_q] && dt_ok && cells_ok;
    wire [31:0]   occ_enq = admit_ok ? d_occ + d_len : d_occ;
    wire [31:0]   port_enq = admit_ok ? port_bytes[d_port] + d_len : port_bytes[d_port];
    wire          mark = admit_ok && cfg_ecn_k != 0 && d_ipv4 && d_ect && d_occ > cfg_ecn_k;
    wire          hdr_done = ret_v && (ret_idx == RX_AW'(HDRW - 1) || {{(16-RX_AW){1'b0}}, ret_idx} == fwords - 16'd1);

    // Telemetry from the pipeline (drops) and the read engine (departures).
    logic                 tel_drop_push, tel_deq_push;
    logic [31:0]          tel_seq;

    // The report's IPv4 header checksum: every field is fixed but the total length and
    // the source address (198.18.0.0/16 + switch id).
    function automatic logic [15:0] tel_ip_checksum(input logic [15:0] total_len, input logic [15:0] swid);
        logic [31:0] sum;
        sum = 32'h4500 + {16'd0, total_len} + 32'h4000 + 32'h4011 + 32'hC612 + {16'd0, swid}
              + 32'hC613 + 32'hFFFE;
        sum = {16'd0, sum[15:0]} + {16'd0, sum[31:16]};
        sum = {16'd0, sum[15:0]} + {16'd0, sum[31:16]};
        tel_ip_checksum = ~sum[15:0];
    endfunction

    function automatic logic [TEL_ENTRY-1:0] postcard(
            input logic [21:0] seq, input logic [15:0] swid, input logic [15:0] in_port,
            input logic [15:0] out_port, input logic [7:0] cls, input logic dropped,
            input logic [31:0] enq_qd, input logic [31:0] deq_qd, input logic [31:0] occ_e,
            input logic [31:0] occ_d, input logic [31:0] port_e, input logic [31:0] port_d,
            input logic [31:0] delta, input logic [47:0] enq_ts, input logic [47:0] deq_ts,
            input logic [31:0] len, input logic [31:0] hash, input logic [31:0] sa, input logic [31:0] da,
            input logic [TEL_HDR*8-1:0] pkt, input logic [7:0] pkt_len);
        logic [TEL_REC*8-1:0] be;   // big-endian headers, first byte in the top bits
        logic [TEL_ENTRY-1:0] r;
        logic [15:0] ip_len;
        logic [7:0] rep_len;
        ip_len = 16'(20 + 8 + 8 + 12 + 68) + {8'd0, pkt_len};
        rep_len = 8'(2 + 17) + ((pkt_len + 8'd3) >> 2);
        be = {48'hFFFFFFFFFFFF, 48'h0, 16'h0800,                                  // Ethernet
              16'h4500, ip_len, 16'h0000, 16'h4000, 16'h4011, tel_ip_checksum(ip_len, swid),
              16'hC612, swid, 32'hC613FFFE,                                       // IPv4
              16'd32766, 16'd32766, ip_len - 16'd20, 16'h0000,                    // UDP
              4'd2, 6'd0, seq, {16'd0, swid},                               // group header
              4'd1, 4'd3, rep_len, 8'd17, dropped, 1'b0, 1'b1, 1'b0, 4'd0,       // individual report
              16'h7C00, 16'h1CA5, 16'hFFC0, 16'h0000,                             // INT main contents
              in_port, out_port, delta, cls, occ_e > 32'hFFFFFF ? 24'hFFFFFF : occ_e[23:0],
              {16'd0, enq_ts}, {16'd0, deq_ts},                                   // baseline metadata
              occ_e, occ_d, port_e, port_d, enq_qd, deq_qd, len, hash, sa, da};  // domain-specific
        r = '0;
        for (int i = 0; i < TEL_REC; i++) r[i*8 +: 8] = be[(TEL_REC - 1 - i)*8 +: 8];
        r[TEL_REC*8 +: TEL_HDR*8] = pkt;
        r[TEL_ENTRY-8 +: 8] = pkt_len;
        postcard = r;
    endfunction

    // Flow control state: 802.3x per port, PFC per (port, class) and per class.
    logic [NPORTS-1:0] congested;
    logic [15:0]       n_congested;
    logic [47:0]       pause_all_until;
    logic [NQ-1:0]     q_congested;
    logic [15:0]       n_congested_q [8];
    logic [47:0]       pfc_all_until [8];
    // Until when this switch asked each port's peer to pause a class (0: it did not), as
    // peer_paused_until(p, c). Every request goes to every port but one and every release
    // to all, so a class holds one time for every port (peer_until) but the port the
    // latest request left out (peer_skip, while peer_skipped), which keeps the time it had
    // (peer_skip_until). (A register a (port, class), written in loops over the ports, was
    // in simulation work for each of them every cycle.)
    logic [47:0]       peer_until [8];
    logic [47:0]       peer_skip_until [8];
    logic [PW-1:0]     peer_skip [8];
    logic [7:0]        peer_skipped;
    function automatic logic [47:0] peer_paused_until(input logic [PW-1:0] p, input logic [2:0] c);
        peer_paused_until = peer_skipped[c] && p == peer_skip[c] ? peer_skip_until[c] : peer_until[c];
    endfunction

    // 802.3x / PFC decisions of this admission.
    wire xoff_port = cfg_pause_on && !cfg_pfc && port_enq > cfg_xoff;
    wire xoff_q = cfg_pause_on && cfg_pfc && occ_enq > xoff_bytes[d_q];
    wire send_pause = ps == S_DEC2 && d_hit && (
        (xoff_port && (n_congested == 0 || now + {16'd0, cfg_refresh_cycles} >= pause_all_until)) ||
        (xoff_q && (n_congested_q[d_class] == 0 || now + {16'd0, cfg_refresh_cycles} >= pfc_all_until[d_class])));

    always_ff @(posedge clk) begin
        if (rst) begin
            ps <= S_IDLE;
            sel <= '0;
            rr_in <= '0;
            flen <= '0;
            fwords <= '0;
            sh <= '0;
            iss <= '0;
            ret_v <= 1'b0;
            ret_idx <= '0;
            cp_idx <= '0;
            cp_prev <= '0;
            cp_first <= '0;
            flood_left <= '0;
            {d_hit, d_ipv4, d_ect, d_ihl5, d_mark, d_acc} <= '0;
            d_port <= '0; d_class <= '0; d_ip_off <= '0; d_saddr <= '0; d_daddr <= '0; d_hash <= '0;
            d_newck <= '0; d_occ_enq <= '0; d_port_enq <= '0; d_qdepth <= '0; d_enq <= '0;
        end else begin
            ret_v <= 1'b0;
            case (ps)
                S_IDLE:
                    if (info_valid != 0) begin
                        logic [PW-1:0] p;
                        p = rr_next(info_valid, rr_in);
                        sel <= p;
                        flen <= info_len[p];
                        fwords <= (info_len[p] + 16'(CW - 1)) / 16'(CW);
                        sh <= '0;
                        iss <= '0;
                        ps <= S_HDR;
                    end
                S_HDR: begin
                    if ({{(16-RX_AW){1'b0}}, iss} < fwords && iss < RX_AW'(HDRW)) begin
                        iss <= iss + 1'b1;
                        ret_v <= 1'b1;
                        ret_idx <= iss;
                    end
                    if (ret_v)
                        for (int w = 0; w < HDRW; w++)
                            if (ret_idx == RX_AW'(w))
                                for (int i = 0; i < CW; i++)
                                    if (w * CW + i < 64) sh[(w * CW + i)*8 +: 8] <= rx_word[sel][i*8 +: 8];
                    if (hdr_done) ps <= S_DEC1;
                end
                S_DEC1: begin
                    d_hit <= p_hit;
                    d_port <= p_port;
                    d_class <= p_class;
                    d_ipv4 <= p_ipv4;
                    d_ect <= p_ect;
                    d_ihl5 <= p_ihl5;
                    d_ip_off <= p_ip_off;
                    d_saddr <= p_saddr;
                    d_daddr <= p_daddr;
                    d_hash <= p_l4 ? crc32_13(p_flow) : 32'd0;   // here, not every cycle
                    d_newck <= p_newck;
                    d_enq <= now;
                    ps <= S_DEC2;
                end
                S_DEC2: begin
                    iss <= '0;
                    cp_idx <= '0;
                    d_occ_enq <= occ_enq;
                    d_port_enq <= port_enq;
                    d_qdepth <= q_pkts[d_q];
                    if (d_hit) begin
                        d_acc <= 1'b1;
                        d_mark <= mark;
                        ps <= admit_ok ? S_COPY : S_DONE;
                    end else begin
                        // Flood: a copy to every other port, not held to the limits.
                        d_acc <= 1'b0;
                        d_mark <= 1'b0;
                        flood_left <= ~(NPORTS'(1) << sel);
                        ps <= S_FLOOD;
                    end
                end
                S_FLOOD: begin
                    logic found;
                    found = 1'b0;
                    for (int p = 0; p < NPORTS; p++)
                        if (!found && flood_left[p]) begin
                            found = 1'b1;
                            d_port <= PW'(p);
                            flood_left[p] <= 1'b0;
                        end
                    iss <= '0;
                    cp_idx <= '0;
                    if (!found) ps <= S_DONE;
                    else if (cells_ok) ps <= S_COPY;
                end
                S_COPY: begin
                    if ({{(16-RX_AW){1'b0}}, iss} < fwords) begin
                        iss <= iss + 1'b1;
                        ret_v <= 1'b1;
                        ret_idx <= iss;
                    end
                    if (ret_v) begin
                        cp_idx <= cp_idx + 16'd1;
                        cp_prev <= alloc_cell;
                        if (cp_idx == 0) cp_first <= alloc_cell;
                        if (cp_idx == fwords - 16'd1) ps <= S_LINK;
                    end
                end
                S_LINK: ps <= d_acc ? S_DONE : S_FLOOD;
                S_DONE: ps <= S_IDLE;
                default: ps <= S_IDLE;
            endcase
            if (ps == S_DONE) rr_in <= sel;
        end
    end

    // The words of the frame as they go into cells, the ECN mark applied.
    always_comb begin
        logic [15:0] base;
        cw_en = ps == S_COPY && ret_v;
        cw_addr = alloc_cell;
        cw_data = rx_word[sel];
        base = {{(16-RX_AW){1'b0}}, ret_idx} * 16'(CW);
        if (d_mark)
            for (int i = 0; i < CW; i++) begin
                if (base + 16'(i) == {11'd0, d_ip_off} + 16'd1) cw_data[i*8 +: 2] = 2'b11;
                if (d_ihl5 && base + 16'(i) == {11'd0, d_ip_off} + 16'd10) cw_data[i*8 +: 8] = d_newck[15:8];
                if (d_ihl5 && base + 16'(i) == {11'd0, d_ip_off} + 16'd11) cw_data[i*8 +: 8] = d_newck[7:0];
            end
        alloc = cw_en;
        rd_off = iss;
        rd_en = '0;
        if (ps == S_HDR || ps == S_COPY) rd_en[sel] = 1'b1;
        release_frame = '0;
        if (ps == S_DONE) release_frame[sel] = 1'b1;
        adm_valid = ps == S_DEC2 && d_hit && admit_ok;
        adm_q = d_q;
        adm_len = d_len;
        com_valid = ps == S_LINK;
        com_q = d_q;
        com_first = cp_first;
        com_last = cp_prev;
        dw_en = ps == S_LINK;
        dw_addr = cp_first;
        dw_data = {flen, sel, d_enq, d_occ_enq, d_port_enq, d_qdepth, d_hash, d_saddr, d_daddr, d_acc};
        tel_drop_push = ps == S_DEC2 && d_hit && !admit_ok && cfg_tel_mode != 0;
    end


    // ------------------------------------------------------------ read engine
    typedef enum logic [1:0] {E_IDLE, E_RUN} estate_t;
    estate_t            es;
    logic [PW-1:0]      e_port, rr_out;
    logic [QW-1:0]      e_q;
    logic [CELL_AW-1:0] e_cell;          // the cell whose word arrives now
    logic [15:0]        e_idx;           // its index in the frame
    logic [DESC_W-1:0]  e_desc;
    logic [TEL_HDR*8-1:0] e_hdr;

    // Which port and class to serve next: ports in turn, classes by strict priority,
    // a paused class passed over; a port only when it will need the frame soon (see
    // port_tx: the frame stays in its queue until then) and has room for it.
    logic          pick;
    logic [PW-1:0] pick_port;
    logic [2:0]    pick_class;
    // Only while idle (nothing else takes it) and something is queued.
    always_comb begin
        logic [NPORTS-1:0] ready;
        logic [7:0] classes;
        pick = 1'b0;
        pick_port = '0;
        pick_class = '0;
        ready = '0;
        classes = '0;
        if (es == E_IDLE && q_busy != 0) begin
            for (int p = 0; p < NPORTS; p++)
                ready[p] = tx_want[p] && tx_words[p] <= (TX_AW+1)'((1 << TX_AW) - MAXW)
                           && (q_busy[p*8 +: 8] & ~paused[p]) != 0;
            if (ready != 0) begin
                pick = 1'b1;
                pick_port = rr_next(ready, rr_out);
                classes = q_busy[{pick_port, 3'b000} +: 8] & ~paused[pick_port];
                for (int c = 7; c >= 0; c--)
                    if (classes[c]) pick_class = 3'(c);
            end
        end
    end

    wire [DESC_W-1:0] cur_desc = e_idx == 0 ? rd_desc : e_desc;
    wire [15:0]       cur_len = cur_desc[DESC_W-1 -: 16];
    wire [15:0]       cur_words = (cur_len + 16'(CW - 1)) / 16'(CW);
    wire              cur_last = es == E_RUN && e_idx == cur_words - 16'd1;
    // the descriptor's fields
    wire [PW-1:0]     ds_in = cur_desc[DESC_W-17 -: PW];
    wire [47:0]       ds_enq = cur_desc[DESC_W-17-PW -: 48];
    wire [31:0]       ds_occ_enq = cur_desc[DESC_W-65-PW -: 32];
    wire [31:0]       ds_port_enq = cur_desc[DESC_W-97-PW -: 32];
    wire [15:0]       ds_qdepth = cur_desc[DESC_W-129-PW -: 16];
    wire [31:0]       ds_hash = cur_desc[65 +: 32];
    wire [31:0]       ds_saddr = cur_desc[33 +: 32];
    wire [31:0]       ds_daddr = cur_desc[1 +: 32];
    wire              ds_acc = cur_desc[0];

    wire [2:0]        e_class = e_q[2:0];
    wire [31:0]       occ_deq = occ[e_q] - (ds_acc ? {16'd0, cur_len} : 32'd0);
    wire [31:0]       port_deq = port_bytes[e_port] - (ds_acc ? {16'd0, cur_len} : 32'd0);
    logic [31:0]      tel_count [NPORTS];
    logic [31:0]      tel_last_occ [NQ];
    logic             sample;
    always_comb begin
        case (cfg_tel_mode)
            3'd1: sample = 1'b1;
            3'd2: sample = tel_count[e_port] + 32'd1 >= cfg_tel_n;
            3'd3: sample = occ_deq >= tel_last_occ[e_q] + cfg_tel_delta || occ_deq + cfg_tel_delta <= tel_last_occ[e_q];
            3'd4: sample = ds_occ_enq >= cfg_tel_threshold;
            default: sample = 1'b0;
        endcase
    end

    always_ff @(posedge clk) begin
        if (rst) begin
            es <= E_IDLE;
            e_port <= '0;
            rr_out <= '0;
            e_q <= '0;
            e_cell <= '0;
            e_idx <= '0;
            e_desc <= '0;
            e_hdr <= '0;
            for (int p = 0; p < NPORTS; p++) tel_count[p] <= '0;
            for (int q = 0; q < NQ; q++) tel_last_occ[q] <= '0;
        end else begin
            case (es)
                E_IDLE:
                    if (pick) begin
                        e_port <= pick_port;
                        e_q <= {pick_port, pick_class};
                        e_cell <= q_head[{pick_port, pick_class}];
                        e_idx <= '0;
                        e_hdr <= '0;
                        rr_out <= pick_port;
                        es <= E_RUN;
                    end
                E_RUN: begin
                    if (e_idx == 0) e_desc <= rd_desc;
                    if (32'(e_idx) * CW < TEL_HDR) e_hdr <= departing_header(e_hdr, e_idx, rd_cell_data);
                    e_cell <= rd_cell_next;
                    e_idx <= e_idx + 16'd1;
                    if (cur_last) begin
                        es <= E_IDLE;
                        if (cfg_tel_mode == 3'd2) tel_count[e_port] <= sample ? 32'd0 : tel_count[e_port] + 32'd1;
                        if (cfg_tel_mode == 3'd3 && sample) tel_last_occ[e_q] <= occ_deq;
                    end
                end
                default: es <= E_IDLE;
            endcase
        end
    end

    // The header bytes a departure's postcard carries: those read so far and this word's.
    function automatic logic [TEL_HDR*8-1:0] departing_header(input logic [TEL_HDR*8-1:0] so_far,
                                                               input logic [15:0] idx, input logic [CW*8-1:0] word);
        logic [TEL_HDR*8-1:0] h;
        h = so_far;
        for (int i = 0; i < CW; i++)
            if (32'(idx) * CW + i < TEL_HDR) h[(32'(idx) * CW + i)*8 +: 8] = word[i*8 +: 8];
        departing_header = h;
    endfunction

    always_comb begin
        rd_cell = es == E_RUN ? rd_cell_next : q_head[{pick_port, pick_class}];
        txw_valid = '0;
        if (es == E_RUN) txw_valid[e_port] = 1'b1;
        txw_data = rd_cell_data;
        txw_last = cur_last;
        txw_bytes = cur_last ? BW'(cur_len - e_idx * 16'(CW)) : BW'(CW);
        free_push = es == E_RUN;
        free_in = e_cell;
        fin_valid = cur_last;
        fin_q = e_q;
        fin_next = rd_cell_next;
        rel_valid = cur_last && ds_acc;
        rel_len = {16'd0, cur_len};
        tel_deq_push = cur_last && sample;
    end

    // Postcards are built in the cycle their event happens and queued the next.
    logic                 tel_drop_q, tel_deq_q;
    logic [TEL_ENTRY-1:0] tel_drop_rec, tel_deq_rec;
    always_ff @(posedge clk) begin
        tel_drop_q <= !rst && tel_drop_push;
        tel_deq_q <= !rst && tel_deq_push;
        if (tel_drop_push)
            tel_drop_rec <= postcard(tel_seq[21:0], cfg_switch_id[15:0], 16'(sel) + 16'd1, 16'(d_port) + 16'd1,
                                {5'd0, d_class}, 1'b1, {16'd0, q_pkts[d_q]}, {16'd0, q_pkts[d_q]}, d_occ,
                                d_occ, port_bytes[d_port], port_bytes[d_port], 32'd0, to_us(now, cfg_us_mul), to_us(now, cfg_us_mul),
                                d_len, d_hash, d_saddr, d_daddr, sh[TEL_HDR*8-1:0],
                                flen < 16'(TEL_HDR) ? flen[7:0] : 8'(TEL_HDR));
        if (tel_deq_push)
            tel_deq_rec <= postcard(tel_seq[21:0] + {21'd0, tel_drop_push}, cfg_switch_id[15:0], 16'(ds_in) + 16'd1,
                               16'(e_port) + 16'd1, {5'd0, e_class}, 1'b0, {16'd0, ds_qdepth},
                               {16'd0, q_pkts[e_q] - 16'd1}, ds_occ_enq, occ_deq, ds_port_enq, port_deq,
                               32'(to_us(now, cfg_us_mul) - to_us(ds_enq, cfg_us_mul)), to_us(ds_enq, cfg_us_mul), to_us(now, cfg_us_mul), {16'd0, cur_len},
                               ds_hash, ds_saddr, ds_daddr, departing_header(e_hdr, e_idx, rd_cell_data),
                               cur_len < 16'(TEL_HDR) ? cur_len[7:0] : 8'(TEL_HDR));
    end

    // --------------------------------------------------------- flow control
    always_ff @(posedge clk) begin
        if (rst) begin
            congested <= '0;
            n_congested <= '0;
            pause_all_until <= '0;
            q_congested <= '0;
            for (int c = 0; c < 8; c++) begin
                n_congested_q[c] <= '0;
                pfc_all_until[c] <= '0;
                peer_until[c] <= '0;
                peer_skip_until[c] <= '0;
                peer_skip[c] <= '0;
            end
            peer_skipped <= '0;
        end else begin
            logic up, down, cup, cdown;
            logic [15:0] n;
            // 802.3x, per port
            up = ps == S_DEC2 && d_hit && xoff_port && !congested[d_port];
            down = rel_valid && cfg_pause_on && !cfg_pfc && congested[e_port] && port_deq <= cfg_xon
                   && !(up && d_port == e_port);
            n = n_congested + {15'd0, up} - {15'd0, down};
            n_congested <= n;
            if (ps == S_DEC2 && d_hit && xoff_port) congested[d_port] <= 1'b1;
            if (down) congested[e_port] <= 1'b0;
            // (PAUSE to every port but d_port: the one it leaves out keeps its time)
            if (send_pause && xoff_port) begin
                pause_all_until <= now + {16'd0, cfg_pause_cycles};
                peer_skip_until[0] <= peer_paused_until(d_port, 3'd0);
                peer_skip[0] <= d_port;
                peer_skipped[0] <= 1'b1;
                peer_until[0] <= now + {16'd0, cfg_pause_cycles};
            end
            if (down && n == 0) begin
                peer_until[0] <= '0;
                peer_skipped[0] <= 1'b0;
            end
            // PFC, per (port, class): nothing to do without it
            if (cfg_pause_on && cfg_pfc) begin
                for (int c = 0; c < 8; c++) begin
                    cup = ps == S_DEC2 && d_hit && xoff_q && d_class == 3'(c) && !q_congested[d_q];
                    cdown = rel_valid && cfg_pause_on && cfg_pfc && e_class == 3'(c) && q_congested[e_q]
                            && occ_deq <= xon_bytes[e_q] && !(cup && d_q == e_q);
                    n_congested_q[c] <= n_congested_q[c] + {15'd0, cup} - {15'd0, cdown};
                end
                // a request names d_class, a release e_class (as cup and cdown above)
                if (send_pause && xoff_q) begin
                    pfc_all_until[d_class] <= now + {16'd0, cfg_pause_cycles};
                    peer_skip_until[d_class] <= peer_paused_until(d_port, d_class);
                    peer_skip[d_class] <= d_port;
                    peer_skipped[d_class] <= 1'b1;
                    peer_until[d_class] <= now + {16'd0, cfg_pause_cycles};
                end
                cup = ps == S_DEC2 && d_hit && xoff_q && d_class == e_class && !q_congested[d_q];
                cdown = rel_valid && q_congested[e_q] && occ_deq <= xon_bytes[e_q] && !(cup && d_q == e_q);
                if (cdown && n_congested_q[e_class] + {15'd0, cup} == 16'd1) begin
                    peer_until[e_class] <= '0;
                    peer_skipped[e_class] <= 1'b0;
                end
            end
            if (ps == S_DEC2 && d_hit && xoff_q) q_congested[d_q] <= 1'b1;
            if (rel_valid && cfg_pause_on && cfg_pfc && q_congested[e_q] && occ_deq <= xon_bytes[e_q]
                && !(ps == S_DEC2 && d_hit && xoff_q && d_q == e_q))
                q_congested[e_q] <= 1'b0;
        end
    end

    // MAC Control requests to the ports, this cycle.
    always_comb begin
        logic down, last;
        down = rel_valid && cfg_pause_on && !cfg_pfc && congested[e_port] && port_deq <= cfg_xon
               && !(ps == S_DEC2 && d_hit && xoff_port && d_port == e_port);
        last = n_congested == 16'd1 && !(ps == S_DEC2 && d_hit && xoff_port && !congested[d_port]);
        // (each loop over the ports only in the cycle that needs it: this is evaluated
        // every cycle in simulation)
        for (int p = 0; p < NPORTS; p++) begin
            ctl_xoff[p] = '0;
            ctl_xon[p] = '0;
        end
        // XOFF to every port but the congested one (its host only receives; pausing it
        // would hold back its ACKs)
        if (send_pause)
            for (int p = 0; p < NPORTS; p++)
                if (PW'(p) != d_port) begin
                    if (xoff_port) ctl_xoff[p][0] = 1'b1;
                    if (xoff_q) ctl_xoff[p][d_class] = 1'b1;
                end
        // XON to the ports still paused, once the last congested port is at XON
        if (down && last)
            for (int p = 0; p < NPORTS; p++)
                if (now < peer_paused_until(PW'(p), 3'd0)) ctl_xon[p][0] = 1'b1;
        if (rel_valid && cfg_pause_on && cfg_pfc && q_congested[e_q] && occ_deq <= xon_bytes[e_q]
            && n_congested_q[e_class] == 16'd1)
            for (int p = 0; p < NPORTS; p++)
                if (now < peer_paused_until(PW'(p), e_class)) ctl_xon[p][e_class] = 1'b1;
    end

    // ------------------------------------------------------------- telemetry
    logic                 tdrop_valid, tdeq_valid, tdrop_full, tdeq_full, tdrop_pop, tdeq_pop;
    logic [TEL_ENTRY-1:0] tdrop_head, tdeq_head;
    logic [3:0]           tdrop_count, tdeq_count;
    sync_fifo #(.W(TEL_ENTRY), .AW(3)) tel_drops (
        .clk, .rst, .push(tel_drop_q), .din(tel_drop_rec), .pop(tdrop_pop), .dout(tdrop_head),
        .valid(tdrop_valid), .full(tdrop_full), .count(tdrop_count));
    sync_fifo #(.W(TEL_ENTRY), .AW(3)) tel_departures (
        .clk, .rst, .push(tel_deq_q), .din(tel_deq_rec), .pop(tdeq_pop), .dout(tdeq_head),
        .valid(tdeq_valid), .full(tdeq_full), .count(tdeq_count));
    // Every postcard takes a sequence number, sent or not: a full FIFO shows as a gap.
    always_ff @(posedge clk)
        if (rst) tel_seq <= '0;
        else tel_seq <= tel_seq + {31'd0, tel_drop_push} + {31'd0, tel_deq_push};

    localparam int TF = TEL_REC + TEL_HDR;        // the longest postcard frame
    typedef enum logic [1:0] {TL_IDLE, TL_SEND, TL_GAP} tlstate_t;
    tlstate_t      tls;
    logic [TF*8-1:0] tl_frame;
    logic [15:0]   tl_len, tl_pos, tl_gap;
    logic          tl_next_drop;                 // drops and departures take turns
    always_comb begin
        tdrop_pop = tls == TL_IDLE && tdrop_valid && (tl_next_drop || !tdeq_valid);
        tdeq_pop = tls == TL_IDLE && tdeq_valid && !tdrop_pop;
        tel_valid = tls == TL_SEND;
        tel_data = '0;
        tel_keep = '0;
        for (int i = 0; i < LW; i++)
            if (tls == TL_SEND && tl_pos + 16'(i) < tl_len) begin
                tel_data[i*8 +: 8] = tl_frame[(32'(tl_pos) + i)*8 +: 8];
                tel_keep[i] = 1'b1;
            end
        tel_last = tls == TL_SEND && tl_pos + 16'(LW) >= tl_len;
    end
    always_ff @(posedge clk) begin
        if (rst) begin
            tls <= TL_IDLE;
            tl_frame <= '0;
            tl_len <= '0;
            tl_pos <= '0;
            tl_gap <= '0;
            tl_next_drop <= 1'b0;
        end else
            case (tls)
                TL_IDLE:
                    if (tdrop_pop || tdeq_pop) begin
                        logic [TEL_ENTRY-1:0] e;
                        e = tdrop_pop ? tdrop_head : tdeq_head;
                        tl_frame <= e[TEL_ENTRY-9:0];
                        tl_len <= 16'(TEL_REC) + {8'd0, e[TEL_ENTRY-1 -: 8]};
                        tl_pos <= '0;
                        tl_next_drop <= !tdrop_pop;
                        tls <= TL_SEND;
                    end
                TL_SEND: begin
                    tl_pos <= tl_pos + 16'(LW);
                    if (tel_last) begin
                        tl_gap <= 16'(24 / LW);
                        tls <= TL_GAP;
                    end
                end
                TL_GAP:
                    if (tl_gap == 0) tls <= TL_IDLE;
                    else tl_gap <= tl_gap - 16'd1;
                default: tls <= TL_IDLE;
            endcase
    end

    // ----------------------------------------------------------------- stats
    logic [31:0] st_drop_pkts [NQ];
    logic [31:0] st_drop_bytes [NQ];
    logic [31:0] st_tx_pkts [NQ];
    logic [31:0] st_tx_bytes [NQ];
    logic [31:0] st_ecn [NQ];
    logic [31:0] st_ctl_rx [NPORTS];
    logic [31:0] st_pause_rx [NPORTS];
    logic [31:0] st_xon_rx [NPORTS];
    logic [31:0] st_pause_tx [NPORTS];
    logic [31:0] st_xon_tx [NPORTS];
    logic [31:0] st_rx_err [NPORTS];
    logic [31:0] st_tel_lost;
    always_ff @(posedge clk) begin
        if (rst) begin
            for (int q = 0; q < NQ; q++) begin
                st_drop_pkts[q] <= '0; st_drop_bytes[q] <= '0; st_tx_pkts[q] <= '0;
                st_tx_bytes[q] <= '0; st_ecn[q] <= '0;
            end
            for (int p = 0; p < NPORTS; p++) begin
                st_ctl_rx[p] <= '0; st_pause_rx[p] <= '0; st_xon_rx[p] <= '0;
                st_pause_tx[p] <= '0; st_xon_tx[p] <= '0; st_rx_err[p] <= '0;
            end
            st_tel_lost <= '0;
        end else begin
            if (STATS) begin
                if (ps == S_DEC2 && d_hit && !admit_ok) begin
                    st_drop_pkts[d_q] <= st_drop_pkts[d_q] + 32'd1;
                    st_drop_bytes[d_q] <= st_drop_bytes[d_q] + d_len;
                end
                if (adm_valid && mark) st_ecn[d_q] <= st_ecn[d_q] + 32'd1;
                if (cur_last) begin
                    st_tx_pkts[e_q] <= st_tx_pkts[e_q] + 32'd1;
                    st_tx_bytes[e_q] <= st_tx_bytes[e_q] + {16'd0, cur_len};
                end
            end
            if ((ctl_rx_valid | sent_xoff | sent_xon | rx_error) != 0)
                for (int p = 0; p < NPORTS; p++) begin
                    if (ctl_rx_valid[p]) begin
                        st_ctl_rx[p] <= st_ctl_rx[p] + 32'd1;
                        if (ctl_rx_quanta[p] == 0) st_xon_rx[p] <= st_xon_rx[p] + 32'd1;
                        else st_pause_rx[p] <= st_pause_rx[p] + 32'd1;
                    end
                    if (sent_xoff[p]) st_pause_tx[p] <= st_pause_tx[p] + 32'd1;
                    if (sent_xon[p]) st_xon_tx[p] <= st_xon_tx[p] + 32'd1;
                    if (rx_error[p]) st_rx_err[p] <= st_rx_err[p] + 32'd1;
                end
            st_tel_lost <= st_tel_lost + {31'd0, tel_drop_q && tdrop_full} + {31'd0, tel_deq_q && tdeq_full};
        end
    end

    // Reads: 0x4000+q occupancy, 0x5000+q frames queued, 0x6000+q drops, 0x7000+q dropped
    // bytes, 0x8000+q frames sent, 0x9000+q bytes sent, 0xA000+q ECN marks, 0xC000+q PFC
    // congested; 0xB000+8p+k per port (k: 0 bytes, 1 MAC Control received, 2 PAUSE
    // received, 3 XON received, 4 XOFF sent, 5 XON sent, 6 receive errors, 7 congested);
    // 0xD000+k switch (k: 0 congested ports, 1 cells used, 2 pool bytes, 3 postcards,
    // 4 postcards lost, 5 now[31:0], 6 now[47:32], 7 most pool bytes, 8+c congested
    // queues of class c).
    always_comb begin
        logic [11:0] i;
        logic [QW-1:0] qi;
        logic [PW-1:0] pi;
        i = mgmt_addr[11:0];
        qi = mgmt_addr[QW-1:0];
        pi = mgmt_addr[3 +: PW];
        mgmt_rdata = '0;
        case (mgmt_addr[15:12])
            4'h0: if (mgmt_addr[15:5] == 11'd0)
                      case (32'(mgmt_addr[4:0]))
                          CFG_SWITCH_ID: mgmt_rdata = cfg_switch_id;
                          CFG_PAUSE_ON: mgmt_rdata = {31'd0, cfg_pause_on};
                          CFG_XOFF: mgmt_rdata = cfg_xoff;
                          CFG_XON: mgmt_rdata = cfg_xon;
                          CFG_QUANTA: mgmt_rdata = {16'd0, cfg_quanta};
                          CFG_PAUSE_CYCLES: mgmt_rdata = cfg_pause_cycles;
                          CFG_REFRESH_CYCLES: mgmt_rdata = cfg_refresh_cycles;
                          CFG_TEL_MODE: mgmt_rdata = {29'd0, cfg_tel_mode};
                          CFG_ECN_K: mgmt_rdata = cfg_ecn_k;
                          CFG_PFC: mgmt_rdata = {31'd0, cfg_pfc};
                          CFG_OBEY: mgmt_rdata = {31'd0, cfg_obey};
                          default: mgmt_rdata = '0;
                      endcase
            ADDR_LIMIT[15:12]: if (32'(i) < NQ) mgmt_rdata = limit_bytes[qi];
            ADDR_OCC[15:12]: if (32'(i) < NQ) mgmt_rdata = occ[qi];
            ADDR_QUEUE_PKTS[15:12]: if (32'(i) < NQ) mgmt_rdata = {16'd0, q_pkts[qi]};
            ADDR_DROPS[15:12]: if (32'(i) < NQ) mgmt_rdata = st_drop_pkts[qi];
            ADDR_DROP_BYTES[15:12]: if (32'(i) < NQ) mgmt_rdata = st_drop_bytes[qi];
            ADDR_TX_PKTS[15:12]: if (32'(i) < NQ) mgmt_rdata = st_tx_pkts[qi];
            ADDR_TX_BYTES[15:12]: if (32'(i) < NQ) mgmt_rdata = st_tx_bytes[qi];
            ADDR_ECN[15:12]: if (32'(i) < NQ) mgmt_rdata = st_ecn[qi];
            ADDR_CONGESTED[15:12]: if (32'(i) < NQ) mgmt_rdata = {31'd0, q_congested[qi]};
            ADDR_PORT_STATS[15:12]: if (32'(i[11:3]) < NPORTS)
                      case (i[2:0])
                          3'd0: mgmt_rdata = port_bytes[pi];
                          3'd1: mgmt_rdata = st_ctl_rx[pi];
                          3'd2: mgmt_rdata = st_pause_rx[pi];
                          3'd3: mgmt_rdata = st_xon_rx[pi];
                          3'd4: mgmt_rdata = st_pause_tx[pi];
                          3'd5: mgmt_rdata = st_xon_tx[pi];
                          3'd6: mgmt_rdata = st_rx_err[pi];
                          default: mgmt_rdata = {31'd0, congested[pi]};
                      endcase
            ADDR_SWITCH_STATS[15:12]:
                case (i)
                    12'd0: mgmt_rdata = {16'd0, n_congested};
                    12'd1: mgmt_rdata = 32'(cells_used);
                    12'd2: mgmt_rdata = pool_bytes;
                    12'd3: mgmt_rdata = tel_seq;
                    12'd4: mgmt_rdata = st_tel_lost;
                    12'd5: mgmt_rdata = now[31:0];
                    12'd6: mgmt_rdata = {16'd0, now[47:32]};
                    12'd7: mgmt_rdata = pool_max;
                    default: if (i >= 12'd8 && i < 12'd16) mgmt_rdata = {16'd0, n_congested_q[i[2:0]]};
                endcase
            default: mgmt_rdata = '0;
        endcase
    end

    // ------------------------------------------------------------- idle time
    always_comb begin
        // Nothing in flight anywhere, counting what a FIFO holds before its head shows it.
        quiet = ps == S_IDLE && info_valid == 0 && rx_holding == 0 && es == E_IDLE && !pick && tx_active == 0
                && tls == TL_IDLE && tdrop_count == 0 && tdeq_count == 0 && !tel_drop_q && !tel_deq_q
                && rx_valid == 0;
        wake = '0;
        for (int p = 0; p < NPORTS; p++) begin
            logic queued;
            queued = q_busy[p*8 +: 8] != 0;
            if (tx_wake[p] != 0 && (wake == 0 || tx_wake[p] < wake)) wake = tx_wake[p];
            // a shaped port with frames in the buffer: when it will take the next one
            if (queued && tx_wake_next[p] != 0 && (wake == 0 || tx_wake_next[p] < wake)) wake = tx_wake_next[p];
        end
    end
endmodule
