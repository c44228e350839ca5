;redcode-94
;name Twin Imp
;author decentrain (held out)
;strategy two imps launched a third of the core apart
start   spl     second
        jmp     imp
second  mov.i   imp, imp+2667
        jmp     imp+2667
imp     mov.i   0, 1
        end     start
