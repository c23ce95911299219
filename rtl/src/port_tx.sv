// The transmit side of one switch port: a FIFO of whole frames (CW-byte words from the
// buffer's read engine) sent at link rate, LW bytes a cycle, each followed by the idle
// time the wire takes for what a MAC adds (FCS, padding to 64 bytes, preamble and
// inter-frame gap: 24 bytes at least), so that a port's throughput is the link's.
// Between two frames it sends the MAC Control frames the switch asks for (802.3x PAUSE
// or 802.1Qbb PFC, XOFF or XON, per class): they go before any waiting data frame.
//
// It also keeps the pause its link partner asked for: `paused[c]` while the quanta of
// the last PAUSE/PFC received for class c last (one quantum: 512 bit times, 64
// cycles at 1 Gbit/s), which the read engine obeys by not starting a frame of that class.
//
// It asks for its next frame (want_next) only when it will need it within LEAD cycles:
// so a frame stays in the buffer, counted against its queue, until shortly before it
// leaves, and a pause received stops the port after the frame on the wire and at most
// the one being handed over.
module port_tx #(
    parameter int LW = 1,
    parameter int CW = 8,
    parameter int AW = 9,                  // transmit FIFO: 2**AW words
    parameter int LEAD = 260               // cycles the buffer takes to hand over a frame, at most
) (
    input  logic             clk,
    input  logic             rst,
    input  logic [47:0]      now,
    // frames from the buffer, one word a cycle
    input  logic             wr_valid,
    input  logic [CW*8-1:0]  wr_data,
    input  logic             wr_last,
    input  logic [$clog2(CW+1)-1:0] wr_bytes,  // valid bytes of the word
    output logic [AW:0]      fifo_words,
    output logic             want_next,    // the port will need its next frame within LEAD cycles
    // MAC Control to send, per class: XOFF (quanta cfg_quanta) or XON (quanta 0)
    input  logic [7:0]       ctl_xoff,
    input  logic [7:0]       ctl_xon,
    input  logic             cfg_pfc,
    input  logic [15:0]      cfg_quanta,
    input  logic [47:0]      mac,
    input  logic [31:0]      cfg_shaper,   // at least this many cycles between frame starts (0: line rate)
    // MAC Control received at this port
    input  logic             obey_valid,
    input  logic [7:0]       obey_enable,
    input  logic [127:0]     obey_quanta,
    input  logic [31:0]      quantum_cycles,   // a pause quantum: 512 bit times
    output logic [7:0]       paused,
    // the wire
    output logic             tx_valid,
    output logic [LW*8-1:0]  tx_data,
    output logic [LW-1:0]    tx_keep,
    output logic             tx_last,
    // for the core
    output logic             sent_xoff,
    output logic             sent_xon,
    output logic             active,       // sending, or has something to send now
    output logic [47:0]      wake,         // the next time a pause or the shaper lets it send (0: none)
    output logic [47:0]      wake_next     // when it will next want a frame, held by the shaper (0: not)
);
    localparam int BW = $clog2(CW + 1);
    localparam int FW = 1 + BW + CW * 8;

    logic [FW-1:0] head;
    logic          head_valid, fifo_full, pop;
    sync_fifo #(.W(FW), .AW(AW)) words (
        .clk, .rst, .push(wr_valid), .din({wr_last, wr_bytes, wr_data}), .pop, .dout(head),
        .valid(head_valid), .full(fifo_full), .count(fifo_words));
    wire            head_last = head[FW-1];
    wire [BW-1:0]   head_bytes = head[FW-2 -: BW];
    wire [CW*8-1:0] head_data = head[CW*8-1:0];

    // Whole frames in the FIFO: a frame starts only once all of it is here.
    logic [AW:0] frames;
    wire frame_in = wr_valid && wr_last && !fifo_full;
    wire frame_out = pop && head_last;
    always_ff @(posedge clk)
        if (rst) frames <= '0;
        else frames <= frames + {{AW{1'b0}}, frame_in} - {{AW{1'b0}}, frame_out};

    // The pause the link partner asked for, and the end of the latest (so that a port
    // nobody paused compares one time a cycle, not eight: in simulation every port
    // evaluates this every cycle).
    logic [47:0] pause_until [8];
    logic [47:0] pause_end;
    always_ff @(posedge clk)
        if (rst) begin
            for (int c = 0; c < 8; c++) pause_until[c] <= '0;
            pause_end <= '0;
        end else if (obey_valid) begin
            logic [47:0] t, last;
            last = '0;
            for (int c = 0; c < 8; c++) begin
                t = obey_enable[c] ? now + 48'(obey_quanta[c*16 +: 16]) * {16'd0, quantum_cycles} : pause_until[c];
                pause_until[c] <= t;
                if (t > last) last = t;
            end
            pause_end <= last;
        end
    always_comb begin
        paused = '0;
        if (now < pause_end)
            for (int c = 0; c < 8; c++) paused[c] = now < pause_until[c];
    end

    // MAC Control frames waiting, per class.
    logic [7:0] pend, pend_xon;
    logic [2:0] ctl_class;
    logic       ctl_is_xon;
    logic       ctl_any;
    always_comb begin
        ctl_any = pend != 0;
        ctl_class = '0;
        if (ctl_any)
            for (int c = 7; c >= 0; c--) if (pend[c]) ctl_class = 3'(c);
    end

    // A byte-exact 60-byte MAC Control frame (before the FCS the MAC appends).
    function automatic logic [60*8-1:0] control_frame(input logic [47:0] src, input logic pfc,
                                                      input logic [2:0] cls, input logic [15:0] quanta);
        logic [60*8-1:0] f;
        f = '0;
        {f[0*8 +: 8], f[1*8 +: 8], f[2*8 +: 8], f[3*8 +: 8], f[4*8 +: 8], f[5*8 +: 8]} = 48'h0180C2000001;
        for (int i = 0; i < 6; i++) f[(6 + i)*8 +: 8] = src[(5 - i)*8 +: 8];
        f[12*8 +: 8] = 8'h88;
        f[13*8 +: 8] = 8'h08;
        f[14*8 +: 8] = pfc ? 8'h01 : 8'h00;
        f[15*8 +: 8] = 8'h01;
        if (!pfc) begin
            f[16*8 +: 8] = quanta[15:8];
            f[17*8 +: 8] = quanta[7:0];
        end else begin
            f[17*8 +: 8] = 8'(1) << cls;   // class_enable, low byte
            f[(18 + 2 * 32'(cls))*8 +: 8] = quanta[15:8];
            f[(19 + 2 * 32'(cls))*8 +: 8] = quanta[7:0];
        end
        control_frame = f;
    endfunction

    typedef enum logic [1:0] {T_IDLE, T_DATA, T_CTL, T_GAP} tstate_t;
    tstate_t st;
    logic [BW-1:0]   bpos;         // next byte of the head word
    logic [15:0]     flen;         // bytes of this frame sent so far
    logic [15:0]     gap;          // idle cycles left
    logic [60*8-1:0] ctl_frame;
    logic [47:0]     last_start;   // when the last data frame started (the shaper's reference)
    logic            started;      // one has: the shaper holds the next
    wire  [47:0]     shaper_next = started ? last_start + {16'd0, cfg_shaper} : 48'd0;

    // Cycles a frame of `len` bytes occupies the wire beyond its own bytes.
    function automatic logic [15:0] gap_cycles(input logic [15:0] len);
        logic [16:0] wire_bytes;
        wire_bytes = (len + 16'd4 < 16'd64 ? 17'd64 : {1'b0, len} + 17'd4) + 17'd20;
        gap_cycles = 16'((wire_bytes + 17'(LW - 1)) / 17'(LW) - ({1'b0, len} + 17'(LW - 1)) / 17'(LW));
    endfunction

    wire start_data = head_valid && frames != 0 && (cfg_shaper == 0 || now >= shaper_next);
    // Cycles the frame on the wire still takes: the words left of it (it is alone here).
    wire [AW+16:0] left_cycles = {16'd0, fifo_words} * (AW+17)'(CW / LW);
    assign want_next = (cfg_shaper == 0 || now + 48'(LEAD) >= shaper_next) &&
                       (st == T_DATA ? frames == 1 && left_cycles <= (AW+17)'(LEAD) : frames == 0);
    wire [BW-1:0] word_left = head_bytes - bpos;
    wire [15:0] ctl_pos = flen;

    always_comb begin
        tx_valid = 1'b0;
        tx_data = '0;
        tx_keep = '0;
        tx_last = 1'b0;
        pop = 1'b0;
        if (st == T_DATA) begin
            tx_valid = 1'b1;
            for (int i = 0; i < LW; i++)
                if (BW'(i) < word_left) begin
                    tx_data[i*8 +: 8] = head_data[(32'(bpos) + i)*8 +: 8];
                    tx_keep[i] = 1'b1;
                end
            pop = word_left <= BW'(LW);
            tx_last = pop && head_last;
        end else if (st == T_CTL) begin
            tx_valid = 1'b1;
            for (int i = 0; i < LW; i++)
                if (32'(ctl_pos) + i < 60) begin
                    tx_data[i*8 +: 8] = ctl_frame[(32'(ctl_pos) + i)*8 +: 8];
                    tx_keep[i] = 1'b1;
                end
            tx_last = 32'(ctl_pos) + LW >= 60;
        end
    end

    assign ctl_is_xon = pend_xon[ctl_class];
    assign sent_xoff = st == T_IDLE && ctl_any && !ctl_is_xon;
    assign sent_xon = st == T_IDLE && ctl_any && ctl_is_xon;

    always_ff @(posedge clk) begin
        if (rst) begin
            st <= T_IDLE;
            bpos <= '0;
            flen <= '0;
            gap <= '0;
            pend <= '0;
            pend_xon <= '0;
            ctl_frame <= '0;
            last_start <= '0;
            started <= 1'b0;
        end else begin
            case (st)
                T_IDLE:
                    if (ctl_any) begin
                        ctl_frame <= control_frame(mac, cfg_pfc, ctl_class, ctl_is_xon ? 16'd0 : cfg_quanta);
                        pend[ctl_class] <= 1'b0;
                        flen <= '0;
                        st <= T_CTL;
                    end else if (start_data) begin
                        last_start <= now;
                        started <= 1'b1;
                        flen <= '0;
                        bpos <= '0;
                        st <= T_DATA;
                    end
                T_DATA: begin
                    flen <= flen + (word_left < BW'(LW) ? 16'(word_left) : 16'(LW));
                    bpos <= pop ? '0 : bpos + BW'(LW);
                    if (tx_last) begin
                        gap <= gap_cycles(flen + 16'(word_left)) - 16'd2;   // T_GAP, then T_IDLE, is idle too
                        st <= T_GAP;
                    end
                end
                T_CTL: begin
                    flen <= flen + 16'(LW);
                    if (tx_last) begin
                        gap <= gap_cycles(16'd60) - 16'd2;
                        st <= T_GAP;
                    end
                end
                T_GAP:
                    if (gap == 0) st <= T_IDLE;
                    else gap <= gap - 16'd1;
            endcase
            // Requests: the newest for a class replaces what was waiting (XON over XOFF
            // in the same cycle). Whole vectors: a loop over classes costs every port
            // eight steps a cycle in simulation.
            if ((ctl_xoff | ctl_xon) != 0) begin
                pend <= (st == T_IDLE && ctl_any ? pend & ~(8'd1 << ctl_class) : pend) | ctl_xoff | ctl_xon;
                pend_xon <= (pend_xon & ~ctl_xoff) | ctl_xon;
            end
        end
    end

    always_comb begin
        // A word anywhere in the FIFO is work: the head shows it only a cycle or two after
        // it is written. Only a frame the shaper holds waits (for wake).
        active = st != T_IDLE || ctl_any || (fifo_words != 0 && (cfg_shaper == 0 || now >= shaper_next));
        wake = '0;
        if (st == T_IDLE && !ctl_any && frames != 0 && cfg_shaper != 0 && now < shaper_next) wake = shaper_next;
        if (paused != 0)
            for (int c = 0; c < 8; c++)
                if (paused[c] && (wake == 0 || pause_until[c] < wake)) wake = pause_until[c];
        wake_next = cfg_shaper != 0 && st != T_DATA && frames == 0 && now + 48'(LEAD) < shaper_next
                    ? shaper_next - 48'(LEAD) : 48'd0;
    end
endmodule
