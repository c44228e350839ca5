;redcode-94
;name Imp Gate Clear
;author decentrain
;strategy a core clear behind an imp gate: wipes memory from its own end
gate    dat     #0, #-5
clear   spl     #0, #0
        mov.i   wipe, >gate
        djn.f   -1, >gate
wipe    dat     #0, #0
        end     clear
