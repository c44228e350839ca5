;redcode-94
;name Imp
;author A. K. Dewdney (1984)
;strategy the one-instruction runner: copies itself one cell ahead forever
        mov.i   0, 1
        end
