// The receive side of one switch port: frames arrive at link rate (LW bytes a cycle,
// no back-pressure: a wire cannot wait) and are stored whole, CW bytes a word, in the
// port's receive memory, so the forwarding pipeline sees only complete frames
// (store-and-forward). A frame that is too short for an Ethernet header, longer than
// MAXLEN, or finds the memory full is dropped here and counted in `rx_error`.
//
// MAC Control frames (EtherType 0x8808) end here too: a PAUSE (opcode 1) or PFC
// (opcode 0x0101) is reported on `ctl_*` the cycle its last byte arrives, which is when
// the port's transmitter must start obeying it (802.3 Annex 31B).
module port_rx #(
    parameter int LW = 1,
    parameter int CW = 8,
    parameter int AW = 9,          // receive memory: 2**AW words of CW bytes
    parameter int MAXLEN = 2048
) (
    input  logic            clk,
    input  logic            rst,
    input  logic            rx_valid,
    input  logic [LW*8-1:0] rx_data,   // byte 0 of the beat in bits 7:0
    input  logic [LW-1:0]   rx_keep,   // contiguous from bit 0; all ones but on the last beat
    input  logic            rx_last,
    // complete frames, oldest first
    output logic            info_valid,
    output logic [15:0]     info_len,
    input  logic            rd_en,     // read ...
    input  logic [AW-1:0]   rd_off,    // ... this word of the oldest frame ...
    output logic [CW*8-1:0] rd_data,   // ... here the next cycle
    input  logic            release_frame,  // the pipeline is done with the oldest frame
    // MAC Control received
    output logic            ctl_valid,
    output logic [7:0]      ctl_enable,     // classes it names (802.3x PAUSE: all eight)
    output logic [127:0]    ctl_quanta,     // class c's quanta in bits 16c+15:16c
    output logic            rx_error,
    output logic            holding      // complete frames here (info_valid follows a cycle or two later)
);
    localparam int DEPTH = 1 << AW;
    localparam int LANES = CW / LW;
    localparam int LANE_W = LANES > 1 ? $clog2(LANES) : 1;
    localparam int CS_LO = 12;             // MAC Control bytes kept: EtherType .. PFC quanta
    localparam int CS_N = 22;

    logic [CW*8-1:0] mem [DEPTH];
    logic [AW:0]     wr, fstart, base;     // write pointer, this frame's first word, oldest frame
    logic [CW*8-1:0] acc;                  // the word being filled
    logic [LANE_W-1:0] lane;               // next beat's place in acc
    logic [15:0]     flen;                 // bytes of this frame so far (stops past MAXLEN)
    logic            bad;
    logic [CS_N*8-1:0] cs;

    function automatic logic [$clog2(LW+1)-1:0] ones(input logic [LW-1:0] keep);
        ones = '0;
        for (int i = 0; i < LW; i++) ones = ones + {{($clog2(LW+1)-1){1'b0}}, keep[i]};
    endfunction

    wire [$clog2(LW+1)-1:0] nbytes = ones(rx_keep);
    wire [16:0] flen_next = {1'b0, flen} + {{(17-$clog2(LW+1)){1'b0}}, nbytes};

    // This beat's bytes (those past keep are zero), and where they go in the word being
    // filled. Written with one indexed part-select, not a loop over the lanes: every
    // port evaluates this every cycle in simulation, and a loop costs CW/LW compares.
    logic [LW*8-1:0] beat;
    always_comb
        for (int i = 0; i < LW; i++) beat[i*8 +: 8] = rx_keep[i] ? rx_data[i*8 +: 8] : 8'h00;
    localparam int LBW = $clog2(CW * 8);
    wire [LBW-1:0] lane_bit = LBW'(lane) * LBW'(LW * 8);
    // The MAC Control bytes with this beat's share in place (computed on a beat only).
    logic [CS_N*8-1:0] cs_next;
    always_comb begin
        cs_next = cs;
        if (rx_valid && flen < 16'(CS_LO + CS_N))
            for (int i = 0; i < LW; i++)
                if (rx_keep[i] && 32'(flen) + i >= CS_LO && 32'(flen) + i < CS_LO + CS_N)
                    cs_next[(32'(flen) + i - CS_LO)*8 +: 8] = rx_data[i*8 +: 8];
    end
    function automatic logic [15:0] be16(input logic [CS_N*8-1:0] b, input int at);
        be16 = {b[(at - CS_LO)*8 +: 8], b[(at - CS_LO + 1)*8 +: 8]};
    endfunction

    wire word_done = rx_valid && (rx_last || lane == LANE_W'(LANES - 1));
    wire [AW:0] used = wr - base;
    wire mem_full = used == DEPTH[AW:0];
    wire frame_long = flen_next > 17'(MAXLEN);

    // Frames complete in memory: their lengths, oldest first.
    logic info_full;
    logic push_info;
    logic [2:0] info_count;
    sync_fifo #(.W(16), .AW(2)) infos (
        .clk, .rst, .push(push_info), .din(flen_next[15:0]), .pop(release_frame), .dout(info_len),
        .valid(info_valid), .full(info_full), .count(info_count));

    // Decoded on a frame's last beat only (nothing reads them before).
    logic is_ctl;
    logic [15:0] opcode;
    /* verilator lint_off UNUSEDSIGNAL */
    logic [15:0] class_enable;   // PFC: bit c names class c; 8..15 are reserved
    /* verilator lint_on UNUSEDSIGNAL */
    wire ends_ok = rx_valid && rx_last && !bad && !(word_done && mem_full) && !frame_long && flen_next >= 17'd14;
    assign push_info = ends_ok && !is_ctl && !info_full;
    assign holding = info_count != 0;

    always_comb begin
        is_ctl = 1'b0;
        opcode = '0;
        class_enable = '0;
        ctl_enable = '0;
        ctl_quanta = '0;
        if (rx_valid && rx_last) begin
            is_ctl = be16(cs_next, 12) == 16'h8808;
            opcode = be16(cs_next, 14);
            class_enable = be16(cs_next, 16);
            ctl_enable = opcode == 16'h0001 ? 8'hFF : class_enable[7:0];
            for (int c = 0; c < 8; c++)
                ctl_quanta[c*16 +: 16] = opcode == 16'h0001 ? be16(cs_next, 16) : be16(cs_next, 18 + 2 * c);
        end
        ctl_valid = ends_ok && is_ctl && (opcode == 16'h0001 || opcode == 16'h0101);
    end
    assign rx_error = rx_valid && rx_last && !(ends_ok && (is_ctl || !info_full));

    always_ff @(posedge clk) begin
        // the word with this beat in place (acc is zero past the bytes it has)
        if (word_done && !mem_full && !bad) mem[wr[AW-1:0]] <= acc | ((CW*8)'(beat) << lane_bit);
        // only the port the pipeline reads: a read of every port's memory each cycle is
        // work for the simulation (and power for the hardware) with no use
        if (rd_en) rd_data <= mem[base[AW-1:0] + rd_off];
    end

    always_ff @(posedge clk) begin
        if (rst) begin
            wr <= '0;
            fstart <= '0;
            base <= '0;
            acc <= '0;
            lane <= '0;
            flen <= '0;
            bad <= 1'b0;
            cs <= '0;
        end else begin
            if (release_frame) base <= base + (AW+1)'((info_len + 16'(CW - 1)) / 16'(CW));
            if (rx_valid) begin
                cs <= cs_next;
                flen <= frame_long ? flen : flen_next[15:0];
                if (word_done) begin
                    acc <= '0;
                    lane <= '0;
                    if (!mem_full && !bad) wr <= wr + 1'b1;
                end else begin
                    acc[lane_bit +: LW*8] <= beat;
                    lane <= lane + 1'b1;
                end
                if ((word_done && mem_full) || frame_long) bad <= 1'b1;
                if (rx_last) begin
                    flen <= '0;
                    bad <= 1'b0;
                    cs <= '0;
                    // keep the frame, or forget its words
                    if (push_info) fstart <= wr + 1'b1;
                    else wr <= fstart;
                end
            end
        end
    end
endmodule
