;redcode-94
;name Tiny Scanner
;author decentrain
;strategy compares two cells a step apart; bombs the first non-empty one with SPL then DAT
step    equ     12
scan    add.f   inc, ptr
        sne.i   *ptr, @ptr
        jmp     scan
        mov.i   trap, *ptr
        mov.i   trap, @ptr
        jmp     scan
inc     dat     #step, #step
ptr     dat     #step, #step+6
trap    spl     #0, #0
        end     scan
