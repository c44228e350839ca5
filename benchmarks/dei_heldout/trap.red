;redcode-94
;name Pit Trapper
;author decentrain (held out)
;strategy scatters JMP traps that send enemy processes into a SPL/DAT pit
step    equ     37
start   mov.i   fang, @ptr
        add.ab  #step, ptr
        sub.ab  #step, fang
        djn.b   start, #800
pit     spl     #0, #0
        dat     #0, #0
fang    jmp     pit-100, #0
ptr     dat     #0, #100
        end     start
